"""A step settled by another transaction is never overwritten by the engine (session 17's open finding).

After a reload at the same epoch, the old context's atomic attempt may still commit its step (it had
passed its stop check) after the reload read that step as running. The new context runs the same
attempt again; if that run fails, the engine's next step write (the retry's attempt count, or the
step's failure) used to overwrite the committed step: the retry then committed the activity's user
writes a second time, or the run failed although its activity had committed.

The old attempt's late commit is made here by the very function an atomic attempt commits with
(``commit_atomic_attempt``), at the moment the race allows: after the reload, before the new
attempt's failure is written. Each test drives an in-process engine tick by tick."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

import weft_django as weft
from weft_django.codec import encode
from weft_django.engine.activities import commit_atomic_attempt
from weft_django.engine.engine import Engine
from weft_django.models import Step, Timer, Workflow
from weft_django.status import StepStatus, TimerKind

from ..testapp.models import Reservation
from .ticking import tick_until

# PostgreSQL only: the attempts held on the gate keep their atomic transactions open, and on SQLite an
# open write transaction keeps out the late commit this test makes (one writer at a time).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

GATE = threading.Event()


def _reserve_once(order_id: int) -> int:
    attempt = weft.activity_info().attempt
    if attempt == 1:
        GATE.wait(30)
        raise ValueError("attempt 1 fails (in this context)")
    Reservation.objects.create(order_id=order_id * 10 + attempt)  # a second commit of the activity
    return attempt


@weft.activity(atomic=True, retry=weft.RetryPolicy(max_attempts=3, initial_backoff="10ms"))
def se_reserve_retried(order_id: int) -> int:
    return _reserve_once(order_id)


@weft.activity(atomic=True, retry=weft.RetryPolicy(max_attempts=1))
def se_reserve_once(order_id: int) -> int:
    return _reserve_once(order_id)


@weft.workflow(name="tests.se_retried")
def se_retried(ctx: Any, order_id: int) -> Any:
    reserved = yield ctx.run(se_reserve_retried, order_id)
    yield ctx.wait_for_signal("end")  # parked: nothing of the race may be left behind
    return reserved


@weft.workflow(name="tests.se_once")
def se_once(ctx: Any, order_id: int) -> Any:
    reserved = yield ctx.run(se_reserve_once, order_id)
    yield ctx.wait_for_signal("end")
    return reserved


@pytest.fixture(autouse=True)
def _gate() -> Iterator[None]:
    GATE.clear()
    yield
    GATE.set()


def _step(run_id: str) -> tuple[str, int, Any]:
    row = Step.objects.get(run_id=run_id, seq=0)
    return row.status, row.attempts, row.result


@pytest.mark.parametrize(
    ("workflow", "new_attempt_fails_into"),
    [("tests.se_retried", "a retry"), ("tests.se_once", "the step's failure")],
)
def test_a_step_committed_by_an_old_contexts_attempt_is_not_overwritten(workflow, new_attempt_fails_into):
    handle = weft.start(workflow, args=[7], id=f"se-{workflow}")
    engine = Engine(f"se-engine-{workflow}")
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].inflight, "attempt 1 running")
        owned = engine.owned[handle.id]
        old_task = owned.inflight[0]
        run_id = str(Workflow.objects.get(pk=handle.id).run_id)
        # A failed pass reloads the workflow at the same epoch: the old attempt is asked to stop, but
        # it may already be past its stop check (its commit is made below, as such an attempt would).
        engine._reload[handle.id] = owned.epoch
        engine._drop(handle.id, reason=None)
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].inflight, "the reload")
        new_task = engine.owned[handle.id].inflight[0]
        assert new_task is not old_task and new_task.key == old_task.key
        with transaction.atomic():
            Reservation.objects.create(order_id=71)  # the old attempt's user write
            commit_atomic_attempt(engine.engine_id, "default", old_task, encode(41))
        assert _step(run_id)[:2] == (StepStatus.COMPLETED, 1)
        GATE.set()  # the new context's attempt 1 fails: the engine writes {new_attempt_fails_into}
        tick_until(engine, engine.idle, "the engine to be idle")
        assert Workflow.objects.get(pk=handle.id).status == "running", new_attempt_fails_into
        # Parked on its signal, with the committed result: no retry left to fire (a retry timer
        # written by the failure kept the engine busy, and the run from being evicted, until it ended).
        assert not Timer.objects.filter(workflow_id=handle.id, kind=TimerKind.ACTIVITY_RETRY).exists()
        assert not engine.owned[handle.id].timers and not engine.owned[handle.id].inflight
        weft.signal(handle.id, "end")
        tick_until(engine, lambda: Workflow.objects.get(pk=handle.id).status != "running", "the run to end")
    finally:
        engine.shutdown()
    row = Workflow.objects.get(pk=handle.id)
    assert (row.status, row.error) == ("completed", None), new_attempt_fails_into
    assert handle.result(timeout=1) == 41
    assert _step(run_id) == (StepStatus.COMPLETED, 1, encode(41))
    assert sorted(Reservation.objects.values_list("order_id", flat=True)) == [71], "the activity committed twice"
    assert engine.refused_commits >= 1  # counted as refused (weft_fenced_commits_refused reason atomic)


def test_a_reload_for_a_step_settled_elsewhere_is_not_reported_as_a_lost_claim():
    """The engine's commit found the step settled by an old context's atomic attempt (stale): it
    reloads the workflow at the same epoch and goes on driving it. Before: claim_lost was sent with
    reason "lost_race" (and weft_claims_total{outcome="lost_race"}, the status line's lost=+1 counted
    it) for a claim the engine still held."""
    from weft_django import signals
    from weft_django.models import WorkflowClaim

    lost: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        lost.append(kwargs)

    signals.claim_lost.connect(receiver)
    handle = weft.start("tests.se_retried", args=[8], id="se-not-lost")
    engine = Engine("se-engine-not-lost")
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].inflight, "attempt 1 running")
        owned = engine.owned[handle.id]
        epoch, old_task = owned.epoch, owned.inflight[0]
        engine._reload[handle.id] = owned.epoch
        engine._drop(handle.id, reason=None)
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].inflight, "the reload")
        with transaction.atomic():
            commit_atomic_attempt(engine.engine_id, "default", old_task, encode(81))
        GATE.set()
        tick_until(engine, engine.idle, "the engine to be idle")
        assert engine.refused_commits >= 1  # the stale commit happened
        assert handle.id in engine.owned and engine.owned[handle.id].epoch == epoch  # still driven, same claim
        assert WorkflowClaim.objects.get(pk=handle.id).engine_id == engine.engine_id
        assert [(e["workflow_id"], e["reason"]) for e in lost] == []
        weft.signal(handle.id, "end")
        tick_until(engine, lambda: Workflow.objects.get(pk=handle.id).status != "running", "the run to end")
    finally:
        signals.claim_lost.disconnect(receiver)
        engine.shutdown()
    assert handle.result(timeout=1) == 81
