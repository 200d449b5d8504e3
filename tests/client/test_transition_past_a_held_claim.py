"""cancel() and suspend() of a run whose claim a user's open transaction holds (PostgreSQL).

A transition locks the claim first and waits for it as for any row lock: weft puts no bound of its
own on a client's wait (the engine's sessions have one; a caller's have the server's or its own
``lock_timeout``). While it waits nothing of the run has changed; a caller's ``lock_timeout`` ends
it with ``django.db.DatabaseError`` (docs/howto.md: database errors), nothing changed; once the
user's transaction ends, the transition applies."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections

import weft_django as weft
from tests.engine.test_commit_locks import holding, wait_until, waiting_on_locks
from weft_django.models import Workflow, WorkflowClaim

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
CLAIM_ROW = "SELECT 1 FROM weft_django_workflowclaim WHERE workflow_id = %s FOR UPDATE"
ACTIONS: dict[str, tuple[Callable[[], Any], str]] = {
    "cancel": (lambda: weft.get_handle("held").cancel("stop"), "cancelled"),
    "suspend": (lambda: weft.get_handle("held").suspend(), "suspended"),
}


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")


def _state() -> tuple[Any, ...]:
    status, reason = Workflow.objects.values_list("status", "cancel_reason").get(pk="held")
    return status, reason, WorkflowClaim.objects.values_list("epoch", "engine_id").get(pk="held")


def _in_thread(call: Callable[[], Any], lock_timeout_ms: int | None) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            if lock_timeout_ms is not None:  # the caller's own bound, for its session
                with connections["default"].cursor() as cursor:
                    cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{lock_timeout_ms}ms"])
            out["value"] = call()
        except BaseException as exc:  # the test looks at it
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("action", list(ACTIONS))
def test_a_transition_waits_for_a_held_claim_and_changes_nothing_until_it_has_it(action, weft_run_until_idle):
    call, status = ACTIONS[action]
    weft.start("tests.signals", id="held")
    weft_run_until_idle()
    before = _state()
    assert before[0] == "running"
    with holding(CLAIM_ROW, ["held"], hold_at_most=30) as released:
        bounded, out = _in_thread(call, 300)
        bounded.join(20)
        assert isinstance(out.get("error"), DatabaseError), out
        assert "lock timeout" in str(out["error"])
        assert _state() == before
        waiting, out = _in_thread(call, None)
        wait_until(lambda: waiting_on_locks() >= 1, f"{action}() to wait for the claim")
        assert waiting.is_alive() and _state() == before
    assert released.is_set()
    waiting.join(20)
    assert "error" not in out, out
    assert _state()[0] == status and _state()[2][0] != before[2][0]  # applied, the claim at a new epoch
