"""The fenced completion of remote (Celery) attempts, in process: no broker, no worker, no Celery.

engine/remote.py holds the rules a worker commits under; these tests drive them directly against the
tables, so they also run where Celery is not installed.
"""

from __future__ import annotations

import sys
import uuid

import pytest
from django.test import override_settings

import weft_django as weft
from tests.testapp import workflows as testflows
from tests.testapp.models import ActivityCall, Reservation
from weft_django.codec import decode, encode_payload
from weft_django.conf import get_settings
from weft_django.engine import remote
from weft_django.engine.activities import AttemptTask
from weft_django.engine.executors import ActivityExecutors
from weft_django.engine.worker_errors import is_retryable
from weft_django.exceptions import ConfigurationError
from weft_django.models import RemoteAttempt, RemoteAttemptState, Step, Workflow, WorkflowClaim
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db
USING = "default"


def running_attempt(
    workflow_type: str = "tests.celery_echo", args: list | None = None, attempt: int = 1, activity: str = "a"
):
    """A workflow whose step 0 (activity ``activity``) waits for ``attempt``, held by engine "owner"."""
    handle = weft.start(workflow_type, args=args or ["k"], id=f"remote-{uuid.uuid4().hex[:8]}")
    claim = WorkflowClaim.objects.get(pk=handle.id)
    epoch = claim.epoch + 1
    WorkflowClaim.objects.filter(pk=handle.id).update(epoch=epoch, engine_id="owner")
    run_id = str(Workflow.objects.get(pk=handle.id).run_id)
    Step.objects.create(
        workflow_id=handle.id,
        run_id=run_id,
        seq=0,
        kind="activity",
        name=activity,
        status="running",
        attempts=attempt,
        epoch=epoch,
        started_at=db_now(),
    )
    return remote.AttemptKey(handle.id, run_id, 0, attempt, epoch)


def step(key: remote.AttemptKey) -> Step:
    return Step.objects.get(run_id=key.run_id, seq=key.seq)


def test_a_result_is_recorded_once():
    key = running_attempt()
    assert remote.complete(key, '"first"', USING) is remote.Disposition.RECORDED
    recorded = step(key)
    assert (recorded.status, recorded.result, recorded.epoch) == ("completed", '"first"', key.epoch)
    # A duplicate delivery (or a commit retried after an unknown outcome) finds it and writes nothing.
    assert remote.complete(key, '"second"', USING) is remote.Disposition.ALREADY_RECORDED
    assert step(key).result == '"first"'
    assert remote.fail(key, "a", {"type": "X"}, ["X"], "w", USING) is remote.Disposition.NOT_WAITING


def test_a_result_from_an_old_epoch_is_refused_even_when_the_attempt_still_waits():
    key = running_attempt()
    WorkflowClaim.objects.filter(pk=key.workflow_id).update(epoch=key.epoch + 5, engine_id="new-owner")
    assert remote.complete(key, '"late"', USING) is remote.Disposition.STALE_EPOCH
    assert remote.fail(key, "a", {"type": "X"}, ["X"], "w", USING) is remote.Disposition.STALE_EPOCH
    assert step(key).status == "running"
    assert "epoch" in (remote.why_stale(key, USING) or "")


def test_a_released_claim_refuses_results():
    key = running_attempt()
    WorkflowClaim.objects.filter(pk=key.workflow_id).update(engine_id=None)
    assert remote.complete(key, '"late"', USING) is remote.Disposition.STALE_EPOCH
    assert step(key).status == "running"


def test_a_step_that_moved_on_refuses_the_old_attempt():
    key = running_attempt(attempt=1)
    Step.objects.filter(run_id=key.run_id, seq=0).update(attempts=2)
    assert remote.complete(key, '"late"', USING) is remote.Disposition.NOT_WAITING
    assert step(key).status == "running"


def test_a_failed_attempt_cannot_also_succeed():
    key = running_attempt()
    error = {"type": "ConnectionError", "message": "down"}
    assert remote.fail(key, "a", error, ["ConnectionError"], "w1", USING) is remote.Disposition.RECORDED
    assert remote.fail(key, "a", error, ["ConnectionError"], "w2", USING) is remote.Disposition.ALREADY_RECORDED
    assert remote.complete(key, '"late"', USING) is remote.Disposition.NOT_WAITING
    assert step(key).status == "running"  # the owner turns the failure into a retry or an ActivityError
    outcome = remote.poll([key], USING)[key]
    assert (outcome.ok, outcome.error, outcome.error_types) == (False, error, ("ConnectionError",))


def test_expiry_and_completion_exclude_each_other():
    timed_out = running_attempt()
    remote.record_sent([(timed_out, "a", "")], USING)
    assert remote.expire("owner", timed_out, "a", USING) == (remote.Expiry.EXPIRED, None)
    assert remote.complete(timed_out, '"late"', USING) is remote.Disposition.NOT_WAITING
    assert remote.heartbeat(timed_out, "null", "w", USING) == "this attempt is already expired"
    # A context loaded again at the same epoch finds it timed out, not waiting for a worker.
    assert remote.poll([timed_out], USING) == {timed_out: remote.RemoteOutcome(ok=False, expired=True)}

    finished = running_attempt()
    assert remote.complete(finished, '"done"', USING) is remote.Disposition.RECORDED
    assert remote.expire("owner", finished, "a", USING) == (
        remote.Expiry.SETTLED,
        remote.RemoteOutcome(ok=True, result='"done"'),
    )
    assert remote.expire("someone-else", running_attempt(), "a", USING) == (remote.Expiry.NOT_HELD, None)


def test_heartbeats_reach_the_engine_and_say_when_to_stop():
    key = running_attempt()
    remote.record_sent([(key, "a", "")], USING)
    assert remote.heartbeat(key, encode_payload({"step": 3}), "w1", USING) is None
    assert remote.latest_details(key, USING) == {"step": 3}
    assert RemoteAttempt.objects.get(run_id=key.run_id).worker == "w1"
    WorkflowClaim.objects.filter(pk=key.workflow_id).update(epoch=key.epoch + 1)
    assert "epoch" in (remote.heartbeat(key, "null", "w1", USING) or "")


def test_success_clears_the_steps_remote_rows():
    key = running_attempt(attempt=2)
    older = key._replace(attempt=1)
    remote.record_sent([(older, "a", ""), (key, "a", "")], USING)
    RemoteAttempt.objects.filter(attempt=1).update(state=RemoteAttemptState.EXPIRED)
    assert remote.complete(key, "1", USING) is remote.Disposition.RECORDED
    assert not RemoteAttempt.objects.filter(run_id=key.run_id).exists()
    assert remote.poll([key, older], USING) == {key: remote.RemoteOutcome(ok=True, result="1")}


def test_run_attempt_runs_the_activity_and_commits():
    key = running_attempt("tests.celery_echo", ["k"], activity=testflows.celery_echo.name)
    args = encode_payload({"args": ["k", [1, (2, 3)]], "kwargs": {}})
    assert remote.run_attempt(key, testflows.celery_echo.name, args, worker="w") == remote.Disposition.RECORDED
    result = decode(step(key).result)
    assert result["value"] == [1, (2, 3)]
    assert (result["attempt"], result["epoch"]) == (key.attempt, key.epoch)
    # A stale delivery is not even run.
    assert remote.run_attempt(key, testflows.celery_echo.name, args, worker="w") == "skipped"
    assert ActivityCall.objects.filter(name="celery_echo").count() == 1


def test_run_attempt_records_errors_with_their_class_names():
    key = running_attempt(activity=testflows.celery_refuses.name)
    args = encode_payload({"args": ["k"], "kwargs": {}})
    assert remote.run_attempt(key, testflows.celery_refuses.name, args) == remote.Disposition.RECORDED
    outcome = remote.poll([key], USING)[key]
    assert outcome.error is not None and outcome.error["type"] == "ValueError"
    assert not is_retryable(testflows.celery_refuses.retry, outcome.error_types)
    assert is_retryable(weft.RetryPolicy(), outcome.error_types)


def test_a_delivery_naming_another_activity_than_the_step_is_not_run():
    """A message forged on the broker (right key, other activity) runs nothing and records nothing."""
    key = running_attempt(activity=testflows.celery_echo.name)
    args = encode_payload({"args": ["k", 1], "kwargs": {}})
    before = ActivityCall.objects.count()
    assert remote.run_attempt(key, testflows.celery_refuses.name, args) == "skipped"
    assert "not" in (remote.why_stale(key, USING, testflows.celery_refuses.name) or "")
    assert (step(key).status, step(key).result) == ("running", None)
    assert ActivityCall.objects.count() == before
    assert not RemoteAttempt.objects.filter(run_id=key.run_id, state=RemoteAttemptState.FAILED).exists()


def test_a_message_from_an_engine_on_another_database_is_skipped_and_says_so():
    """Two deployments (or two test runs) sharing a broker's queues deliver each other's messages: the
    workflow id and a small epoch may match by chance, the run never does. The worker runs nothing,
    records nothing, and its log names the misrouting (the sending engine only sees a timeout)."""
    key = running_attempt(activity=testflows.celery_echo.name)
    foreign = key._replace(run_id=str(uuid.uuid4()))
    reason = remote.why_stale(foreign, USING, testflows.celery_echo.name) or ""
    assert "another database" in reason and foreign.run_id in reason
    args = encode_payload({"args": ["k", 1], "kwargs": {}})
    before = ActivityCall.objects.count()
    assert remote.run_attempt(foreign, testflows.celery_echo.name, args) == "skipped"
    assert remote.complete(foreign, '"x"', USING) is remote.Disposition.NOT_WAITING
    assert ActivityCall.objects.count() == before
    assert (step(key).status, step(key).result) == ("running", None)
    # The step's own attempt is still wanted: the stranger changed nothing.
    assert remote.why_stale(key, USING, testflows.celery_echo.name) is None


@pytest.mark.django_db(transaction=True)
def test_a_refused_atomic_attempt_rolls_its_writes_back():
    key = running_attempt("tests.celery_echo", ["k"], activity=testflows.celery_reserve.name)
    args = encode_payload({"args": [41], "kwargs": {}})

    def deposed_meanwhile(*a, **kw):
        WorkflowClaim.objects.filter(pk=key.workflow_id).update(epoch=key.epoch + 1)
        return real(*a, **kw)

    real = testflows.celery_reserve.fn
    object.__setattr__(testflows.celery_reserve, "fn", deposed_meanwhile)
    try:
        assert remote.run_attempt(key, testflows.celery_reserve.name, args) == remote.Disposition.STALE_EPOCH
    finally:
        object.__setattr__(testflows.celery_reserve, "fn", real)
    assert not Reservation.objects.filter(order_id=41).exists()
    assert step(key).status == "running"


def _task(definition) -> AttemptTask:
    return AttemptTask("w", str(uuid.uuid4()), 0, 1, 1, definition, "{}", db_now(), None)


def test_an_untimed_celery_activity_fails_at_dispatch_with_a_typed_error():
    executors = ActivityExecutors("e", 1, lambda: None, lambda task, text: None, USING, get_settings())
    executors.submit(_task(testflows.celery_untimed.options(executor="celery")))
    outcome = executors.outcomes.get_nowait()
    assert (outcome.ok, outcome.retryable) == (False, False)
    assert outcome.error is not None and outcome.error["type"] == "ConfigurationError"
    assert "timeout=" in outcome.error["message"]
    executors.shutdown(0)


def test_without_celery_the_celery_executor_refuses_to_start(monkeypatch):
    monkeypatch.setitem(sys.modules, "celery", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "weft_django.contrib.celery", raising=False)
    monkeypatch.delitem(sys.modules, "weft_django.engine.celery_executor", raising=False)
    with override_settings(WEFT={"ACTIVITY_EXECUTOR": "celery"}), pytest.raises(ConfigurationError, match="Celery"):
        ActivityExecutors("e", 1, lambda: None, lambda task, text: None, USING, get_settings())
