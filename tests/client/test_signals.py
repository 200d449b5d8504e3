"""Lifecycle signals: sent after commit with the documented kwargs; a raising receiver is harmless."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

import weft_django as weft
from weft_django import events as observe
from weft_django import signals
from weft_django.engine.driver import StepRecord
from weft_django.engine.engine import Engine
from weft_django.models import Workflow, WorkflowClaim
from weft_django.store.clock import db_now
from weft_django.store.commit import WorkflowWrites
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
NAMES = signals.__all__


@pytest.fixture
def events() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    received: list[tuple[str, dict[str, Any]]] = []
    receivers = []
    for name in NAMES:

        def receiver(sender: Any, signal: Any, name: str = name, **kwargs: Any) -> None:
            received.append((name, {"sender": sender, **kwargs}))

        getattr(signals, name).connect(receiver, weak=False)
        receivers.append((name, receiver))
    yield received
    for name, receiver in receivers:
        getattr(signals, name).disconnect(receiver)


def _of(events: list[tuple[str, dict[str, Any]]], name: str, workflow_id: str | None = None) -> list[dict[str, Any]]:
    return [kw for n, kw in events if n == name and (workflow_id is None or kw.get("workflow_id") == workflow_id)]


def test_start_claim_and_completion(events, weft_run_until_idle):
    handle = weft.start("tests.sum", args=[2, 3], id="sig-sum")
    [started] = _of(events, "workflow_started", "sig-sum")
    row = Workflow.objects.get(pk="sig-sum")
    assert started == {
        "sender": Workflow,
        "using": "default",
        "workflow_id": "sig-sum",
        "run_id": str(row.run_id),
        "workflow_type": "tests.sum",
        "version": row.version,
        "status": "running",
        "parent_id": None,
        "schedule_id": None,
    }
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"total": 5}
    [acquired] = _of(events, "claim_acquired", "sig-sum")
    assert acquired["sender"] is WorkflowClaim
    assert acquired["engine_id"] == "test-in-process" and isinstance(acquired["epoch"], int)
    [completed] = _of(events, "workflow_completed", "sig-sum")
    assert completed == {
        "sender": Workflow,
        "using": "default",
        "workflow_id": "sig-sum",
        "run_id": str(row.run_id),
        "workflow_type": "tests.sum",
        "engine_id": "test-in-process",
        "epoch": acquired["epoch"],
        "result": {"total": 5},
    }
    assert not _of(events, "workflow_failed") and not _of(events, "claim_lost")


def test_failure_and_final_activity_failure(events, weft_run_until_idle):
    weft.start("tests.uncaught_activity_error", args=["sig-fail"], id="sig-fail")
    weft_run_until_idle()
    [failed] = _of(events, "workflow_failed", "sig-fail")
    assert failed["engine_id"] == "test-in-process" and failed["workflow_type"] == "tests.uncaught_activity_error"
    assert failed["error"]["type"] == "ActivityError"
    [activity] = _of(events, "activity_failed", "sig-fail")
    assert activity["seq"] == 1 and activity["attempts"] == 1 and activity["activity"].endswith("refuses")
    assert activity["error"]["type"] == "ValueError" and activity["engine_id"] == "test-in-process"


def test_retried_attempts_are_not_reported_as_failures(events, weft_run_until_idle):
    handle = weft.start("tests.retrying", args=["sig-retry", 2], id="sig-retry")
    weft_run_until_idle()
    assert handle.result(timeout=5) is not None
    assert not _of(events, "activity_failed", "sig-retry")


def test_cancel_is_reported_only_once_the_callers_transaction_commits(events):
    weft.start("tests.signals", id="sig-cancel")
    with transaction.atomic():
        weft.cancel("sig-cancel", reason="operator")
        assert not _of(events, "workflow_cancelled")  # not durable yet
    [cancelled] = _of(events, "workflow_cancelled", "sig-cancel")
    assert cancelled["reason"] == "operator" and cancelled["engine_id"] is None
    assert cancelled["workflow_type"] == "tests.signals" and cancelled["epoch"] is None


def test_a_rolled_back_start_sends_nothing(events):
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.start("tests.sum", args=[1, 1], id="sig-rollback")
        raise RuntimeError("roll back")
    assert not _of(events, "workflow_started", "sig-rollback")


def test_execution_deadline_sends_timed_out(events, weft_run_until_idle, weft_clock):
    weft.start("tests.signals", id="sig-deadline", execution_timeout="1h")
    weft_run_until_idle()
    weft_clock.advance(7200)
    weft_run_until_idle()
    [timed_out] = _of(events, "workflow_timed_out", "sig-deadline")
    assert timed_out["engine_id"] == "test-in-process" and timed_out["workflow_type"] == "tests.signals"
    assert "execution timeout" in timed_out["reason"]


def test_takeover_and_lost_race(events):
    weft.start("tests.signals", id="sig-takeover")
    first, second = Engine("engine-a"), Engine("engine-b")
    try:
        first.tick()  # claims it; it parks waiting for "go"
        assert "sig-takeover" in first.owned
        [acquired] = _of(events, "claim_acquired", "sig-takeover")
        WorkflowClaim.objects.filter(pk="sig-takeover").update(expires_at="2000-01-01T00:00:00Z")
        second.tick()  # the lapsed claim is taken over
        [taken] = _of(events, "claim_taken_over", "sig-takeover")
        assert taken["engine_id"] == "engine-b" and taken["previous_engine_id"] == "engine-a"
        assert taken["epoch"] > acquired["epoch"]
        # The deposed engine commits a settlement under its old epoch: the fence refuses it.
        owned = first.owned["sig-takeover"]
        stale = WorkflowWrites(
            "sig-takeover", owned.run_id, owned.epoch, steps=[StepRecord(0, "signal", "go", "completed", "1")]
        )
        first._commit([stale], db_now())
        [lost] = _of(events, "claim_lost", "sig-takeover")
        assert lost["engine_id"] == "engine-a" and lost["reason"] == "lost_race"
        assert lost["epoch"] == acquired["epoch"] and lost["run_id"] == owned.run_id
        assert "sig-takeover" not in first.owned and observe.stats("engine-a").commits_refused >= 1
        second.start()  # its listener: the signal's wake-up reaches it (as in a running engine)
        weft.signal("sig-takeover", "go", "payload")
        wait_for(lambda: (second.tick() or True) and bool(_of(events, "workflow_completed", "sig-takeover")))
        [completed] = _of(events, "workflow_completed", "sig-takeover")
        assert completed["engine_id"] == "engine-b" and completed["result"] == "payload"
    finally:
        first.shutdown()
        second.shutdown()


def test_a_raising_receiver_never_breaks_the_engine(weft_run_until_idle, caplog):
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    for name in NAMES:
        getattr(signals, name).connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="django.dispatch"):
            handle = weft.start("tests.sum", args=[1, 2], id="sig-broken")
            weft_run_until_idle()
        assert handle.result(timeout=5) == {"total": 3}
        assert "receiver bug" in caplog.text
    finally:
        for name in NAMES:
            getattr(signals, name).disconnect(broken)


def test_nothing_is_built_without_receivers():
    def build() -> dict[str, Any]:
        raise AssertionError("built although nobody listens")

    assert not signals.workflow_completed.has_listeners(Workflow)
    observe._send(signals.workflow_completed, Workflow, "default", build)
