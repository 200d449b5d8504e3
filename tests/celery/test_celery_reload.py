"""A Celery attempt in flight while its engine reloads the workflow at the same epoch (a failed pass,
a failed commit, a refused atomic commit: ``Engine.reload_all`` and friends drop the context and load
it again from the log, under the same claim).

The attempt's message is already with a worker, and the reloaded context waits for the very same
attempt (run, seq, attempt, epoch). The executor must recognise it as still in flight: it must not
send it again (a second delivery passes every check a worker makes and runs the activity a second
time), and its timeout keeps counting from the first send (restarted, an attempt that hangs on its
worker would be timed out a whole timeout late, and never while reloads keep coming).

An in-process engine driven tick by tick, a real ``celery worker`` subprocess over Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("celery")
pytest.importorskip("redis")

import weft_django as weft
from tests.celery import test_celery as kit
from tests.engine.ticking import tick_until
from weft_django.codec import decode
from weft_django.engine import celery_executor
from weft_django.engine.engine import Engine
from weft_django.models import RemoteAttempt, Step, Workflow, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
calls = kit.calls
celery_worker = kit.celery_worker  # real workers on the test database (and Redis skipped when away)
empty_broker = kit.empty_broker  # autouse: this run's broker keys emptied around each test


@pytest.fixture
def engine() -> Iterator[Engine]:
    from tests.celery_app import app

    app.set_current()  # the engine sends through the project's app, as one that loaded it does
    engine = Engine("celery-reload")
    engine.start()
    try:
        yield engine
    finally:
        engine.shutdown()


def _reloaded(engine: Engine, wid: str, old: Any) -> Any:
    """Reload every workflow at its epoch (as after a failed pass); the reloaded context's attempt."""
    epoch = engine.owned[wid].epoch
    engine.reload_all()
    tick_until(engine, lambda: wid in engine.owned and engine.owned[wid].inflight, "the reload")
    assert engine.owned[wid].epoch == epoch
    task = engine.owned[wid].inflight[0]
    assert task is not old and task.key == old.key  # the same attempt, waited for by a new context
    return task


def _spin(engine: Engine, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        engine.tick()
        time.sleep(0.02)


def test_an_attempt_in_flight_is_not_sent_again_after_a_same_epoch_reload(celery_worker, engine, tmp_path):
    celery_worker("reload-dup", concurrency=3)
    gate = tmp_path / "gate"
    handle = weft.start("tests.celery_gated", args=["dup", str(gate)], id="celery-reload-dup")
    tick_until(engine, lambda: len(calls("celery_gated")) == 1, "attempt 1 to run on the worker", timeout=90)
    epoch = WorkflowClaim.objects.get(pk=handle.id).epoch
    _reloaded(engine, handle.id, engine.owned[handle.id].inflight[0])
    _spin(engine, 4)  # a second message would reach the idle worker threads meanwhile
    assert calls("celery_gated") == [f"dup@1/{epoch}"], "the attempt in flight was sent (and run) again"
    gate.touch()
    tick_until(engine, lambda: Workflow.objects.get(pk=handle.id).status != "running", "the run to end")
    assert handle.result(timeout=5)["attempt"] == 1
    assert calls("celery_gated") == [f"dup@1/{epoch}"]


def test_an_attempt_in_flight_keeps_its_timeout_across_a_same_epoch_reload(celery_worker, engine, tmp_path):
    celery_worker("reload-timeout", concurrency=3)
    gate = tmp_path / "gate"  # never opened: attempt 1 hangs on its worker past its 4 s timeout
    handle = weft.start("tests.celery_gated_first", args=["t", str(gate)], id="celery-reload-timeout")
    tick_until(engine, lambda: calls("celery_gated_first"), "attempt 1 to run on the worker", timeout=90)
    old = engine.owned[handle.id].inflight[0]
    assert old.deadline is not None
    sent = old.deadline - 4  # when its message was sent (time.monotonic)
    _spin(engine, max(0.0, sent + 2.5 - time.monotonic()))
    task = _reloaded(engine, handle.id, old)
    tick_until(
        engine,
        lambda: RemoteAttempt.objects.filter(workflow_id=handle.id, attempt=1, state="expired").exists(),
        "attempt 1 to time out",
    )
    late = time.monotonic() - old.deadline
    assert late < 1.5, f"attempt 1 timed out {late:.1f}s after its deadline (its timeout restarted at the reload)"
    assert task.deadline == old.deadline
    tick_until(engine, lambda: Workflow.objects.get(pk=handle.id).status != "running", "the run to end")
    assert handle.result(timeout=5)["attempt"] == 2
    step = Step.objects.get(workflow_id=handle.id, seq=0)
    assert (step.status, step.attempts, decode(step.result)["attempt"]) == ("completed", 2, 2)
    epoch = WorkflowClaim.objects.get(pk=handle.id).epoch
    assert [c for c in calls("celery_gated_first") if c.startswith("t@1/")] == [f"t@1/{epoch}"]
    gate.touch()  # let the worker's hung attempt end (its result is refused: it timed out)


def test_an_attempt_timed_out_just_before_a_same_epoch_reload_is_retried_at_once(celery_worker, engine, tmp_path):
    """The engine's poll commits attempt 1's expiry; the same pass then fails (a database error: the
    tick reloads every workflow) before the retry it decided is committed. The reloaded context still
    waits for attempt 1, which can never finish now: it must be retried at once, not after another
    whole timeout (its message, sent again, is skipped by the worker meanwhile)."""
    celery_worker("reload-expired", concurrency=3)
    gate = tmp_path / "gate"  # never opened: attempt 1 hangs on its worker past its 4 s timeout
    handle = weft.start("tests.celery_gated_first", args=["x", str(gate)], id="celery-reload-expired")
    tick_until(engine, lambda: calls("celery_gated_first"), "attempt 1 to run on the worker", timeout=90)
    old = engine.owned[handle.id].inflight[0]
    assert old.deadline is not None
    time.sleep(max(0.0, old.deadline - time.monotonic()) + 0.1)
    engine.executor.poll(set())  # the pass's first step: it fences attempt 1 out ...
    assert RemoteAttempt.objects.get(workflow_id=handle.id, attempt=1).state == "expired"
    engine.reload_all()  # ... and the pass fails before its writes commit (Engine.tick on a DatabaseError)
    reloaded = time.monotonic()
    tick_until(engine, lambda: any("@2/" in c for c in calls("celery_gated_first")), "attempt 2", timeout=30)
    waited = time.monotonic() - reloaded
    assert waited < 2.5, f"attempt 2 started {waited:.1f}s after the reload (attempt 1 timed out again)"
    tick_until(engine, lambda: Workflow.objects.get(pk=handle.id).status != "running", "the run to end")
    assert handle.result(timeout=5)["attempt"] == 2
    ran = [c for c in calls("celery_gated_first") if c.startswith("x@1/")]
    assert len(ran) == 1, ran  # a message sent again for attempt 1 is skipped by the worker, never run
    gate.touch()


def test_an_attempt_reloaded_long_after_its_deadline_is_timed_out_not_sent_again(
    celery_worker, engine, tmp_path, monkeypatch
):
    """The workflow is dropped for a reload while attempt 1 hangs on its worker, and loaded again only
    after the attempt's deadline and SENT_KEPT_FOR have passed (its loads kept failing: a database
    outage; the executor's poll, first in every pass, ran meanwhile). The executor had forgotten the
    send: the reloaded context sent attempt 1 again, a second delivery that passes every check a worker
    makes, so the activity ran twice under one attempt number and its timeout restarted. It must time
    out as it would have with a context waiting, and be retried as attempt 2."""
    monkeypatch.setattr(celery_executor, "SENT_KEPT_FOR", 0.5)  # 60 s: shortened so the test is quick
    celery_worker("reload-late", concurrency=3)
    gate = tmp_path / "gate"  # never opened: attempt 1 hangs on its worker past its 4 s timeout
    handle = weft.start("tests.celery_gated_first", args=["late", str(gate)], id="celery-reload-late")
    tick_until(engine, lambda: calls("celery_gated_first"), "attempt 1 to run on the worker", timeout=90)
    old = engine.owned[handle.id].inflight[0]
    assert old.deadline is not None
    epoch = engine.owned[handle.id].epoch
    engine.reload_all()  # dropped at its epoch; loaded again by the next tick, which waits
    time.sleep(max(0.0, old.deadline + celery_executor.SENT_KEPT_FOR - time.monotonic()) + 1.0)
    engine.executor.poll(set())  # the passes that failed to load it still polled the executor
    tick_until(engine, lambda: Workflow.objects.get(pk=handle.id).status != "running", "the run to end")
    _spin(engine, 2)  # a second message for attempt 1 would reach an idle worker thread meanwhile
    assert [c for c in calls("celery_gated_first") if c.startswith("late@1/")] == [f"late@1/{epoch}"]
    assert handle.result(timeout=5)["attempt"] == 2
    step = Step.objects.get(workflow_id=handle.id, seq=0)
    assert (step.status, step.attempts) == ("completed", 2)
    gate.touch()  # let the worker's hung attempt end (its result is refused: it timed out)


def test_a_result_committed_while_no_context_waits_is_taken_by_a_late_reload(
    celery_worker, engine, tmp_path, monkeypatch
):
    """The worker commits attempt 1's result while its workflow is dropped for a reload; the reload
    comes after the attempt's deadline and SENT_KEPT_FOR. The result is the step's: the reloaded
    context takes it, nothing is sent or run again, and the timeout does not override it."""
    monkeypatch.setattr(celery_executor, "SENT_KEPT_FOR", 0.5)  # 60 s: shortened so the test is quick
    celery_worker("reload-result", concurrency=3)
    gate = tmp_path / "gate"
    handle = weft.start("tests.celery_gated_first", args=["res", str(gate)], id="celery-reload-result")
    tick_until(engine, lambda: calls("celery_gated_first"), "attempt 1 to run on the worker", timeout=90)
    old = engine.owned[handle.id].inflight[0]
    assert old.deadline is not None
    epoch = engine.owned[handle.id].epoch
    engine.reload_all()  # dropped at its epoch; loaded again by the next tick, which waits
    gate.touch()
    wait_for(lambda: Step.objects.get(workflow_id=handle.id, seq=0).status == "completed", 30, message="the result")
    time.sleep(max(0.0, old.deadline + celery_executor.SENT_KEPT_FOR - time.monotonic()) + 1.0)
    engine.executor.poll(set())  # the passes that failed to load it still polled the executor
    tick_until(engine, lambda: Workflow.objects.get(pk=handle.id).status != "running", "the run to end")
    assert handle.result(timeout=5)["attempt"] == 1
    _spin(engine, 1)
    assert calls("celery_gated_first") == [f"res@1/{epoch}"]
