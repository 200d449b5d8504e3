"""The message cleanup never closes mail of a run that is active when it writes.

``drop_late_signals`` (and the cleanup's failing of orphaned updates) read the rows of runs that are
no longer active, then write. A ``retry()`` committing between the read and the write makes the run
active again, with the same run id: before the fix the write dropped the signal (failed the update)
anyway, a signal that ``signal()`` had reported sent, of a run that waits for it now: the retried run
waited for ever."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import QuerySet

import weft_django as weft
from weft_django.codec import encode
from weft_django.models import BufferedSignal, PendingUpdate, Workflow
from weft_django.store import mailbox
from weft_django.store.clock import db_now
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)
FAILS = {"on": True}


@weft.workflow(name="tests.late_drop")
def late_drop(ctx):
    yield ctx.sleep("1ms")
    if FAILS["on"]:
        raise RuntimeError("first run fails")
    got = yield ctx.wait_for_signal("go")
    return got


@weft.workflow(name="tests.late_update")
def late_update(ctx):
    state = {"n": 0}

    def add(n):
        state["n"] += n
        return state["n"]

    ctx.on_update("add", add)
    yield ctx.sleep("1ms")
    if FAILS["on"]:
        raise RuntimeError("first run fails")
    yield ctx.wait_until(lambda: state["n"] > 0)
    return state["n"]


def _failed(workflow: Any, workflow_id: str) -> Workflow:
    FAILS["on"] = True
    weft.start(workflow, id=workflow_id)
    run_until_idle()
    row = Workflow.objects.get(pk=workflow_id)
    assert row.status == "failed"
    FAILS["on"] = False
    return row


def _retry_after_the_read(monkeypatch: pytest.MonkeyPatch, workflow_id: str) -> None:
    """The user's retry() commits right after the cleanup's read of late rows (before its write)."""
    done: list[int] = []

    def read_then_retry(rows: Any) -> list[Any]:
        found = list(rows)
        if isinstance(rows, QuerySet) and found and not done:  # the read of late rows
            done.append(1)
            weft.get_handle(workflow_id).retry()
        return found

    monkeypatch.setattr(mailbox, "list", read_then_retry, raising=False)


def test_a_late_signal_is_not_dropped_once_its_run_is_retried(monkeypatch):
    row = _failed(late_drop, "late-sig")
    # A signal whose insert committed while the run's terminal commit was in flight.
    late = BufferedSignal.objects.create(
        workflow_id=row.id, run_id=row.run_id, name="go", payload=encode(7), created_at=db_now("default")
    )
    _retry_after_the_read(monkeypatch, row.id)
    mailbox.drop_late_signals("default")
    monkeypatch.undo()
    assert Workflow.objects.get(pk=row.id).status == "running"
    assert BufferedSignal.objects.get(pk=late.pk).state == "buffered", "a signal of a running run was dropped"
    run_until_idle()
    assert weft.get_handle(row.id).result(timeout=5) == 7


def test_a_late_update_is_not_failed_once_its_run_is_retried(monkeypatch):
    row = _failed(late_update, "late-upd")
    now = db_now("default")
    late = PendingUpdate.objects.create(  # admitted while the terminal commit was in flight, long ago
        workflow_id=row.id,
        run_id=row.run_id,
        name="add",
        payload=encode(5),
        created_at=now - timedelta(minutes=1),
        deadline=now + timedelta(minutes=5),
    )
    _retry_after_the_read(monkeypatch, row.id)
    mailbox.cleanup(now, now - timedelta(hours=1), timedelta(seconds=10), "default")
    monkeypatch.undo()
    assert Workflow.objects.get(pk=row.id).status == "running"
    assert PendingUpdate.objects.get(pk=late.pk).status == "admitted", "an update of a running run was failed"
    run_until_idle()
    assert weft.get_handle(row.id).result(timeout=5) == 5
