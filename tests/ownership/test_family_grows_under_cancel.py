"""A family transition (cancel, time out) whose family grows between its read and its lock (PostgreSQL).

cancel(parent) reads the family (the child), then locks the parent's and the child's claims in one
sorted statement; that lock may wait for the child's commit, which starts a grandchild. Its next read
finds the grandchild. Before the fix it then locked the grandchild in a second statement, holding the
others: a grandchild whose id sorts below the child's is locked out of the global order, and a
cancel(child) that read the grandchild locks it first, then waits for the child's claim: a deadlock
(40P01). Now the round's locks are let go (its savepoint rolled back) and the next round locks the
whole family again in one sorted statement.

The interleaving is made, not hoped for: Django's execute_wrapper pauses cancel(parent) before and
after its claim lock on its own connection, and the test sees cancel(child) waiting (pg_stat_activity).
Both run inside transaction.atomic(), so a deadlock is raised instead of retried."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction

import weft_django as weft
from tests.engine.test_commit_locks import wait_until, waiting_on_locks
from weft_django.models import Workflow
from weft_django.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

# Ids sorting grandchild < child < parent: the grandchild is locked first by a cancel of the child.
PARENT, CHILD, GRANDCHILD = "fg-p", "fg-m", "fg-a"


@weft.workflow(name="tests.family_grows.waits")
def waits(ctx: Any) -> Any:
    yield ctx.wait_for_signal("never")


@weft.workflow(name="tests.family_grows.spawner")
def spawner(ctx: Any) -> Any:
    yield ctx.wait_for_signal("spawn")
    yield ctx.start_child("tests.family_grows.waits", id=GRANDCHILD)


@weft.workflow(name="tests.family_grows.parent")
def parent(ctx: Any) -> Any:
    yield ctx.start_child("tests.family_grows.spawner", id=CHILD)


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")


class _Paused:
    """A Django execute_wrapper for one thread's connection: pauses before and after its first claim
    lock statement until the test lets it go on."""

    def __init__(self) -> None:
        self.before, self.go_lock = threading.Event(), threading.Event()
        self.after, self.go_on = threading.Event(), threading.Event()
        self.seen = False

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        first = not self.seen and "weft_django_workflowclaim" in sql and "FOR NO KEY UPDATE" in sql
        if not first:
            return execute(sql, params, many, context)
        self.seen = True
        self.before.set()
        assert self.go_lock.wait(30)
        result = execute(sql, params, many, context)
        self.after.set()
        assert self.go_on.wait(30)
        return result


def _run(call: Any, wrapper: Any = None) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            with transaction.atomic():  # raised, not retried: a deadlock shows
                if wrapper is None:
                    out["value"] = call()
                else:
                    with connections["default"].execute_wrapper(wrapper):
                        out["value"] = call()
        except BaseException as exc:
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_cancels_of_a_parent_and_of_a_child_whose_family_grew_do_not_deadlock():
    weft.start("tests.family_grows.parent", id=PARENT)
    run_until_idle(timeout=20)
    weft.signal(CHILD, "spawn")
    paused = _Paused()
    t1, out1 = _run(lambda: weft.cancel(PARENT, "stop the family"), paused)
    assert paused.before.wait(20)  # cancel(parent) read its family: the child only
    run_until_idle(timeout=20)  # the child's commit starts the grandchild
    assert Workflow.objects.get(pk=GRANDCHILD).status == "running"
    paused.go_lock.set()
    assert paused.after.wait(20)  # cancel(parent) holds the claims of the parent and the child
    t2, out2 = _run(lambda: weft.cancel(CHILD, "stop the child"))
    wait_until(lambda: waiting_on_locks() >= 1, "cancel(child) to wait for the child's claim")
    paused.go_on.set()
    t1.join(30)
    t2.join(30)
    assert not t1.is_alive() and not t2.is_alive()
    errors = [out.get("error") for out in (out1, out2) if isinstance(out.get("error"), DatabaseError)]
    assert errors == []
    statuses = dict(Workflow.objects.values_list("id", "status"))
    assert statuses == {PARENT: "cancelled", CHILD: "cancelled", GRANDCHILD: "cancelled"}
