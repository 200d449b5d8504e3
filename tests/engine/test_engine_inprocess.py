"""The engine driven in process (run_until_idle): every operation and rule of the execution path."""

from __future__ import annotations

import types

import pytest

import weft_django as weft
from tests.testapp.models import ActivityCall, Reservation
from weft_django.engine.engine import Engine
from weft_django.models import Step, Workflow, WorkflowClaim

pytestmark = pytest.mark.django_db(transaction=True)


def calls(name: str, key: str | None = None) -> int:
    qs = ActivityCall.objects.filter(name=name)
    return (qs.filter(key=key) if key is not None else qs).count()


def test_three_steps_complete(weft_run_until_idle):
    handle = weft.start("tests.three_steps", args=["k"], id="three")
    weft_run_until_idle()
    assert handle.status == "completed"
    assert handle.result(timeout=5) == ["k-1", "k-2", "k-3"]
    assert calls("record_call") == 3
    assert list(Step.objects.filter(workflow_id="three").order_by("seq").values_list("seq", "status")) == [
        (0, "completed"),
        (1, "completed"),
        (2, "completed"),
    ]
    claim = WorkflowClaim.objects.get(workflow_id="three")
    assert claim.engine_id is None  # released at the terminal commit


def test_result_round_trips_exactly(weft_run_until_idle):
    handle = weft.start("tests.sum", args=[2, 3])
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"total": 5}


def test_retry_then_success(weft_run_until_idle):
    handle = weft.start("tests.retrying", args=["r1", 2])
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"calls": 3}
    assert Step.objects.get(workflow_id=handle.id, seq=0).attempts == 3


def test_retries_exhausted_surface_activity_error(weft_run_until_idle):
    handle = weft.start("tests.retrying", args=["r2", 10])
    weft_run_until_idle()
    result = handle.result(timeout=5)
    assert result["error"] == "ConnectionError" and result["attempts"] == 3
    assert calls("flaky", "r2") == 3


def test_non_retryable(weft_run_until_idle):
    handle = weft.start("tests.non_retryable", args=["n1"])
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"type": "ValueError", "attempts": 1}
    assert calls("refuses", "n1") == 1


def test_signal_sent_before_the_wait_is_consumed(weft_run_until_idle):
    handle = weft.start("tests.signals", id="sig")
    handle.signal("go", {"x": (1, 2)})
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"x": (1, 2)}


def test_signal_after_parking(weft_run_until_idle):
    handle = weft.start("tests.signals", id="sig2")
    weft_run_until_idle()
    assert handle.status == "running"
    handle.signal("go", "later")
    weft_run_until_idle()
    assert handle.result(timeout=5) == "later"


def test_signal_timeout(weft_run_until_idle, weft_clock):
    handle = weft.start("tests.signals", kwargs={"timeout": "1h"})
    weft_run_until_idle()
    assert handle.status == "running"
    weft_clock.advance(3601)
    weft_run_until_idle()
    assert handle.result(timeout=5) == "timed out"


def test_sleep_is_durable(weft_run_until_idle, weft_clock):
    handle = weft.start("tests.sleeper", args=[3600])
    weft_run_until_idle()
    assert handle.status == "running"
    assert handle.describe()["pending_timers"] == 1
    weft_clock.advance(3601)
    weft_run_until_idle()
    assert handle.result(timeout=5) == "woke"


def test_all_and_race(weft_run_until_idle):
    handle = weft.start("tests.parallel")
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"all": [3, 7], "race": [1, 11]}


def test_memo(weft_run_until_idle):
    handle = weft.start("tests.memo")
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"token": "abc", "tuple": (1, 2)}


def test_workflow_failure(weft_run_until_idle):
    handle = weft.start("tests.fails")
    weft_run_until_idle()
    with pytest.raises(weft.WorkflowFailedError) as info:
        handle.result(timeout=5)
    assert info.value.error["type"] == "RuntimeError"
    assert "workflow code broke" in info.value.error["message"]


def test_atomic_activity_writes_once(weft_run_until_idle):
    handle = weft.start("tests.atomic", args=[7])
    weft_run_until_idle()
    assert handle.result(timeout=5) == 7
    assert Reservation.objects.filter(order_id=7).count() == 1


def test_activity_info(weft_run_until_idle):
    handle = weft.start("tests.info", id="info-1")
    weft_run_until_idle()
    result = handle.result(timeout=5)
    wf = Workflow.objects.get(id="info-1")
    assert result["attempt"] == 1 and result["seq"] == 0
    assert result["key"] == f"info-1:{wf.run_id}:0"
    assert result["epoch"] > 0


def test_attempt_timeout_retries_then_fails_and_late_results_are_dropped(weft_run_until_idle):
    handle = weft.start("tests.timeouts", args=["t1"])
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"type": "ActivityTimeoutError", "attempts": 2}
    step = Step.objects.get(workflow_id=handle.id, seq=0)
    assert step.status == "failed" and step.attempts == 2
    assert calls("too_slow", "t1") == 2


def test_activity_info_outside_an_activity_raises_and_heartbeat_is_a_noop():
    with pytest.raises(weft.WeftError, match="outside an activity"):
        weft.activity_info()
    assert weft.heartbeat({"x": 1}) is None


def test_a_timed_out_atomic_attempt_never_commits_its_writes(weft_run_until_idle):
    import time

    handle = weft.start("tests.atomic_timeout", args=[5])
    weft_run_until_idle()
    assert handle.result(timeout=5) == 2
    time.sleep(1.0)  # let the abandoned first attempt finish and try to commit
    assert list(Reservation.objects.values_list("order_id", flat=True)) == [52]
    step = Step.objects.get(workflow_id=handle.id, seq=0)
    assert step.status == "completed" and step.attempts == 2


def test_renewal_reads_the_loops_live_claims_without_a_publish_per_pass():
    """The engine publishes its own dicts once; renewal copies them at each pass (engine/renewal.py)."""
    engine = Engine("renew-live")
    engine._publish_epochs()
    assert engine.renewal.epochs() == {}
    engine.residency.evicted["parked-1"] = 7
    engine.owned["live-1"] = types.SimpleNamespace(epoch=3)  # type: ignore[assignment]
    assert engine.renewal.epochs() == {"parked-1": 7, "live-1": 3}
    del engine.owned["live-1"]
    assert engine.renewal.epochs() == {"parked-1": 7}
