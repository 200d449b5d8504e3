"""Update settlement past rows a user's open transaction holds (PostgreSQL: row locks).

The engine settles updates between turns in a fenced transaction of its own
(``store.commit.fenced_messages``): the claims with SKIP LOCKED, then the admitted update rows with
SKIP LOCKED. A row another transaction holds (a user's ``SELECT ... FOR UPDATE`` on the claim or on
the update row, a ``cancel()`` inside ``transaction.atomic()``) must neither stall the engine's other
workflows nor be forgotten once it is free."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings

import weft_django as weft
from tests.engine.test_commit_locks import holding
from tests.engine.test_locked_rows import waits  # noqa: F401  (registers tests.locked_rows.waits)
from weft_django.models import PendingUpdate
from weft_django.testing import running_engine, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CLAIM_ROW = "SELECT 1 FROM weft_django_workflowclaim WHERE workflow_id = %s FOR UPDATE"
UPDATE_ROW = "SELECT 1 FROM weft_django_pendingupdate WHERE workflow_id = %s FOR UPDATE"


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``call`` on a thread of its own; its value or error lands in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # the test looks at it
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@override_settings(WEFT={"WORKFLOW_CLAIM_TTL": "30s"})
def test_an_update_to_a_run_whose_claim_a_user_holds_does_not_stall_other_workflows():
    """The held run's update times out at its own timeout, nothing applied; another run's update
    and signal are answered while the claim is still held (a stall would be the engine's lock_timeout,
    15 s here, past the 8 s the good update waits)."""
    held = weft.start("tests.msg_counter", args=[100], id="held")
    good = weft.start("tests.msg_counter", args=[100], id="good")
    signalled = weft.start("tests.locked_rows.waits", id="signalled")
    with running_engine("update-lock-engine") as engine:
        wait_for(lambda: {"held", "good", "signalled"} <= set(engine.owned), 20)
        with holding(CLAIM_ROW, ["held"], hold_at_most=40) as released:
            thread, out = _in_thread(lambda: held.update("add", 1, timeout=3))
            assert good.update("add", 2, timeout=8) == 2
            signalled.signal("go", 7)
            assert signalled.result(timeout=8) == 7
            thread.join(30)
            assert isinstance(out.get("error"), weft.UpdateTimeoutError), out
            assert not released.is_set()
        assert held.update("add", 5, timeout=20) == 5  # the expired update was never applied


@override_settings(WEFT={"WORKFLOW_CLAIM_TTL": "90s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "30s"})
def test_an_update_row_a_user_held_is_settled_once_it_is_free():
    """The settlement skips an update row another transaction holds (SKIP LOCKED); before the fix it
    was not looked at again until a wake-up named its workflow or the mailbox sweep came round (once per
    WORKFLOW_CLAIM_RENEW_INTERVAL, 30 s here), so its caller timed out though the row had been free for
    most of its 10 s timeout."""
    held = weft.start("tests.msg_counter", args=[100], id="held")
    good = weft.start("tests.msg_counter", args=[100], id="good")
    thread, out = _in_thread(lambda: held.update("add", 1, timeout=10))
    wait_for(lambda: PendingUpdate.objects.filter(workflow_id="held").exists(), 10)
    lock = holding(UPDATE_ROW, ["held"], hold_at_most=40)
    released = lock.__enter__()
    try:
        with running_engine("update-lock-engine") as engine:
            wait_for(lambda: {"held", "good"} <= set(engine.owned), 20)
            assert good.update("add", 2, timeout=8) == 2  # answered while the held row is locked
            assert "value" not in out and "error" not in out
            time.sleep(0.5)  # the engine has looked at the held update and skipped it
            lock.__exit__(None, None, None)
            assert released.wait(10)
            thread.join(30)
    finally:
        lock.__exit__(None, None, None)
    assert out == {"value": 1}
