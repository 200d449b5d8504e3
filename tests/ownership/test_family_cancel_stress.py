"""Concurrent cancels of members of the same families (parents, children and grandchildren whose ids
sort before and after each other), while their engine commits and their leaves start new children:
no transition deadlocks (40P01) or hangs (PostgreSQL). Every transition runs inside
transaction.atomic(), so a deadlock is raised instead of retried."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction

import weft_django as weft
from weft_django import transitions
from weft_django.models import Workflow
from weft_django.testing import run_until_idle, running_engine, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
ROUNDS, FAMILIES = 3, 4


@weft.workflow(name="tests.family_stress.node")
def node(ctx: Any, children: list[Any]) -> Any:
    if not children:  # a leaf: starts a child of its own when told to (the family grows)
        spawned = yield ctx.wait_for_signal("spawn")
        yield ctx.all([ctx.start_child("tests.family_stress.node", args=[[]], id=spawned), ctx.wait_for_signal("x")])
    ops = [ctx.start_child("tests.family_stress.node", args=[sub], id=cid) for cid, sub in children]
    yield ctx.all([*ops, ctx.wait_for_signal("x")])


def _family(n: int) -> tuple[str, list[Any], list[str]]:
    """A parent, two children and three grandchildren, ids sorting before and after their parents."""
    tree = [(f"s{n}-a", [(f"s{n}-z", []), (f"s{n}-b", [])]), (f"s{n}-y", [(f"s{n}-c", [])])]
    return f"s{n}-m", tree, [f"s{n}-m", f"s{n}-a", f"s{n}-z", f"s{n}-b", f"s{n}-y", f"s{n}-c"]


def _spawn(leaves: list[str]) -> None:
    for leaf in leaves:  # the new child's id sorts below its parent's ("s0-z" -> "s0-0z")
        weft.signal(leaf, "spawn", leaf[:-1] + "0" + leaf[-1])


def _race(actions: list[Callable[[], Any]], errors: list[BaseException]) -> None:
    barrier = threading.Barrier(len(actions))

    def worker(action: Callable[[], Any]) -> None:
        try:
            barrier.wait(10)
            with transaction.atomic():
                action()
        except (weft.WorkflowTerminalError, weft.WorkflowNotFoundError):
            pass  # ended by another cancel first
        except BaseException as exc:  # the test looks at it
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(action,), daemon=True) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a transition hung"


def test_concurrent_cancels_in_growing_families_do_not_deadlock():
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    rng = random.Random(7)
    errors: list[BaseException] = []
    for round_ in range(ROUNDS):
        families = [_family(round_ * 10 + n) for n in range(FAMILIES)]
        for parent, tree, _ in families:
            weft.start("tests.family_stress.node", args=[tree], id=parent)
        run_until_idle(timeout=30)
        members = {wid for _, _, ids in families for wid in ids}
        assert Workflow.objects.filter(pk__in=members, status="running").count() == len(members)
        with running_engine(f"stress-{round_}") as engine:
            wait_for(lambda members=members: members <= set(engine.owned), 30)
            actions: list[Callable[[], Any]] = []
            for _, _, ids in families:
                actions += [lambda w=w: transitions.cancel(w, "stress") for w in rng.sample(ids, 3)]
                actions.append(lambda ids=ids: _spawn([w for w in ids if w[-1] in "zbc"]))
            _race(actions, errors)
    assert [error for error in errors if isinstance(error, DatabaseError)] == []
    assert errors == []
