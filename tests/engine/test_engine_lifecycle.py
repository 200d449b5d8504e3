"""Engine behaviour around replay errors, delayed starts, transitions and deposition (in process)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

import weft_django as weft
from tests.testapp import workflows as test_workflows
from weft_django.engine.engine import Engine
from weft_django.models import Step, Workflow, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running_engine():
    engine = Engine("threaded-engine")
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    yield engine
    engine.request_stop()
    thread.join(timeout=20)


def test_non_determinism_keeps_the_run_running_and_retries(weft_run_until_idle, weft_clock):
    handle = weft.start("tests.replay_check", id="nd")
    weft_run_until_idle()
    Step.objects.filter(workflow_id="nd", seq=0).update(name="some.other.activity")  # history from other code
    handle.signal("continue", "x")
    weft_run_until_idle()
    row = Workflow.objects.get(id="nd")
    assert row.status == "running"
    assert row.stuck_error["type"] == "NonDeterminismError"
    assert "some.other.activity" in row.stuck_error["message"]
    assert row.stuck_retry_at is not None
    assert WorkflowClaim.objects.get(workflow_id="nd").engine_id is None
    # "Deploy" matching code (restore the history's name) and let the back-off pass.
    Step.objects.filter(workflow_id="nd", seq=0).update(name="tests.testapp.workflows.add")
    weft_clock.advance(60)
    weft_run_until_idle()
    assert handle.result(timeout=5) == [2, "x"]
    assert Workflow.objects.get(id="nd").stuck_error is None


def test_version_mismatch_is_visible_and_not_terminal(weft_run_until_idle):
    handle = weft.start("tests.sum", args=[1, 1], id="vm")
    Workflow.objects.filter(id="vm").update(version="9")
    weft_run_until_idle()
    row = Workflow.objects.get(id="vm")
    assert row.status == "running"
    assert row.stuck_error["type"] == "VersionMismatchError"
    assert 'version "9"' not in row.stuck_error["message"] and "'9'" in row.stuck_error["message"]
    assert handle.status == "running"


def test_delayed_start(weft_run_until_idle, weft_clock):
    handle = weft.start("tests.sum", args=[2, 2], start_after=timedelta(hours=1))
    assert handle.status == "pending"
    weft_run_until_idle()
    assert handle.status == "pending"
    weft_clock.advance(3601)
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"total": 4}


def test_execution_timeout(weft_run_until_idle, weft_clock):
    handle = weft.start("tests.signals", execution_timeout="1h")
    weft_run_until_idle()
    weft_clock.advance(3601)
    weft_run_until_idle()
    with pytest.raises(weft.WorkflowTimedOutError):
        handle.result(timeout=5)


def test_cancel_deposes_the_owner_and_runs_on_cancel_once(running_engine):
    test_workflows.CANCEL_HANDLER_CALLS.clear()
    handle = weft.start("tests.cancellable", id="to-cancel")
    wait_for(lambda: WorkflowClaim.objects.filter(workflow_id="to-cancel", engine_id="threaded-engine").exists())
    wait_for(lambda: "to-cancel" in running_engine.owned)
    epoch_before = WorkflowClaim.objects.get(workflow_id="to-cancel").epoch
    handle.cancel("no longer needed")
    wait_for(lambda: "to-cancel" not in running_engine.owned, message="the engine to drop the workflow")
    assert test_workflows.CANCEL_HANDLER_CALLS == ["to-cancel"]
    claim = WorkflowClaim.objects.get(workflow_id="to-cancel")
    assert claim.epoch > epoch_before and claim.engine_id is None
    with pytest.raises(weft.WorkflowCancelledError):
        handle.result(timeout=5)


def test_suspend_and_resume(running_engine):
    handle = weft.start("tests.signals", id="susp")
    wait_for(lambda: "susp" in running_engine.owned)
    handle.suspend()
    wait_for(lambda: "susp" not in running_engine.owned)
    handle.signal("go", "while suspended")
    handle.resume()
    assert handle.result(timeout=10) == "while suspended"


def test_retry_from_checkpoint(weft_run_until_idle):
    handle = weft.start("tests.non_retryable", args=["retry-me"])
    weft_run_until_idle()
    handle.result(timeout=5)  # the workflow catches the error and completes; use a failing one instead
    failing = weft.start("tests.fails", id="fails-then-retried")
    weft_run_until_idle()
    assert failing.status == "failed"
    failing.retry()
    assert failing.status == "running"
    weft_run_until_idle()
    assert failing.status == "failed"  # same code fails again, from its checkpoint
    assert Step.objects.filter(workflow_id="fails-then-retried").count() == 1


def test_closing_a_generator_that_yields_in_finally(weft_run_until_idle):
    handle = weft.start("tests.yields_in_finally", id="finally")
    weft_run_until_idle()  # parks, then the engine releases it and closes the generator
    assert handle.status == "running"
    handle.cancel()
    assert handle.status == "cancelled"


def test_activity_progress_and_local_queries(running_engine):
    weft.start("tests.progress", args=[1.5], id="progress")
    wait_for(lambda: "progress" in running_engine.owned and running_engine.owned["progress"].inflight)
    wait_for(lambda: running_engine.answer_query("progress", "activity_progress"), message="a heartbeat")
    assert running_engine.answer_query("progress", "activity_progress")["step"] >= 1
    assert running_engine.answer_query("progress", "stage") == "working"
    assert running_engine.answer_query("progress", "echo", 5) == 5
    with pytest.raises(weft.QueryNotFoundError):
        running_engine.answer_query("progress", "nope")
    with pytest.raises(weft.WorkflowNotLocallyOwnedError):
        running_engine.answer_query("someone-else", "stage")


def test_failure_records_the_failing_step_so_retry_reruns_exactly_it(weft_run_until_idle):
    from tests.testapp.models import ActivityCall

    handle = weft.start("tests.uncaught_activity_error", args=["seq-1"], id="uncaught")
    weft_run_until_idle()
    row = Workflow.objects.get(id="uncaught")
    assert row.status == "failed" and row.error["type"] == "ActivityError" and row.error["seq"] == 1
    handle.retry()
    weft_run_until_idle()
    assert ActivityCall.objects.filter(name="refuses", key="seq-1").count() == 2  # re-ran with fresh attempts
    assert Step.objects.filter(workflow_id="uncaught", seq=0).count() == 1

    caught = weft.start("tests.caught_then_fails", args=["seq-2"], id="caught")
    weft_run_until_idle()
    assert "seq" not in Workflow.objects.get(id="caught").error  # the code failed, not a step
    caught.retry()
    weft_run_until_idle()
    assert ActivityCall.objects.filter(name="refuses", key="seq-2").count() == 1  # its failed step stays
