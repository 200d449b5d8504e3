"""Issue 21, items 1 and 4: a workflow's writes become durable in the order it made them, and nothing
is acknowledged (an update's outcome, a query's answer) before what it depends on is durable.

Each test drives an in-process engine tick by tick, with an activity held on a gate, so the race the
review found (an activity's result settled in memory, an update or query served in the same pass,
the pass's batch commit still to come) happens every time, on PostgreSQL and SQLite."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError

import weft_django as weft
from weft_django.engine import engine as engine_module
from weft_django.engine import messages
from weft_django.engine.activities import AttemptOutcome
from weft_django.engine.engine import Engine
from weft_django.models import PendingUpdate, QueryRequest, Step, Workflow
from weft_django.store import commit as store_commit
from weft_django.store.clock import db_now

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)

GATE = threading.Event()
FLIPS = itertools.count()


@weft.activity
def r21_flip() -> int:
    """0, 1, 2, ...: each run of it gives another value (as a real side effect would)."""
    GATE.wait(30)
    return next(FLIPS)


@weft.workflow(name="tests.r21_flip_then_approve")
def flip_then_approve(ctx: Any) -> Any:
    state: dict[str, Any] = {"a": None}
    ctx.on_query("a", lambda: state["a"])
    a = yield ctx.run(r21_flip)
    state["a"] = a
    if a % 2 == 0:  # the branch taken depends on the activity's value
        payload, respond = yield ctx.wait_for_update("approve")
        respond({"a": a, "approved": payload})
        return ["approved", a, payload]
    yield ctx.sleep("1ms")
    return ["slept", a]


@pytest.fixture(autouse=True)
def _gate() -> Iterator[None]:
    global FLIPS
    FLIPS = itertools.count()  # the first run of r21_flip returns 0: the update branch
    GATE.clear()
    yield
    GATE.set()


def _step(workflow_id: str, seq: int) -> str | None:
    return Step.objects.filter(workflow_id=workflow_id, seq=seq).values_list("status", flat=True).first()


def _update_status(workflow_id: str) -> str | None:
    return PendingUpdate.objects.filter(workflow_id=workflow_id).values_list("status", flat=True).first()


def _admit(workflow_id: str, name: str = "approve", payload: str = '"yes"') -> None:
    PendingUpdate.objects.create(
        workflow_id=workflow_id,
        run_id=Workflow.objects.get(pk=workflow_id).run_id,
        name=name,
        payload=payload,
        created_at=db_now(),
    )


def _outcome_waiting(engine: Engine) -> None:
    """Wait (without ticking) until the gated activity's outcome sits in the engine's queue."""
    deadline = time.monotonic() + 30
    while engine.executor.outcomes.empty():
        assert time.monotonic() < deadline, "the activity did not finish"
        time.sleep(0.01)


def _parked_with_activity_running(engine: Engine, workflow_id: str) -> None:
    """Run the workflow to its gated activity (step 0 durable as running), admit the update, and let
    the engine see it parked at that frontier; then open the gate and wait for the outcome."""
    tick_until(engine, lambda: _step(workflow_id, 0) == "running" and engine.executor.running, "step 0 running")
    _admit(workflow_id)
    for _ in range(3):
        engine.tick()
    assert _update_status(workflow_id) == "admitted"  # nothing handles it at the activity's frontier
    GATE.set()
    _outcome_waiting(engine)


def test_an_update_is_never_durable_ahead_of_the_step_before_it(monkeypatch):
    """The review's reproduction: at every commit of the engine, a settled update implies the
    activity before it is durable as completed (on 2ae2264 the update committed first)."""
    handle = weft.start("tests.r21_flip_then_approve", id="r21-order")
    seen: list[tuple[str | None, str | None]] = []

    def check() -> None:
        state = (_update_status(handle.id), _step(handle.id, 0))
        seen.append(state)
        assert state[0] in (None, "admitted") or state[1] == "completed", (
            f"update {state[0]} while step 0 is {state[1]}: the update was made durable ahead of the step"
        )

    real_commit, real_messages = engine_module.fenced_commit, messages.fenced_messages

    def commit(*args: Any, **kwargs: Any) -> Any:
        check()
        result = real_commit(*args, **kwargs)
        check()
        return result

    def settle(*args: Any, **kwargs: Any) -> Any:
        check()
        result = real_messages(*args, **kwargs)
        check()
        return result

    monkeypatch.setattr(engine_module, "fenced_commit", commit)
    monkeypatch.setattr(messages, "fenced_messages", settle)
    engine = Engine("r21-order-engine")
    engine.start()
    try:
        _parked_with_activity_running(engine, handle.id)
        tick_until(engine, lambda: Workflow.objects.get(pk=handle.id).status == "completed", "the run to end")
    finally:
        engine.shutdown()
    assert handle.result(timeout=5) == ["approved", 0, "yes"]
    assert _update_status(handle.id) == "completed"
    assert ("accepted", "completed") in seen or ("completed", "completed") in seen


def test_a_failed_batch_commit_cannot_leave_an_answered_update_in_a_history_that_no_longer_exists(monkeypatch):
    """The pass's commit of the activity's result fails (a lost connection, a lock timeout). On
    2ae2264 the update was already committed as taken at step 1: the reload re-ran the activity, got
    another value, took the other branch, and the run was stuck for good (NonDeterminismError). Now
    nothing of the update is durable before the activity's result, so the replay stays consistent."""
    handle = weft.start("tests.r21_flip_then_approve", id="r21-failed-commit")
    real_commit = engine_module.fenced_commit
    failures = {"left": 0}

    def commit(engine_id: str, batch: list[store_commit.WorkflowWrites], *args: Any, **kwargs: Any) -> Any:
        settles_activity = any(s.seq == 0 and s.status == "completed" for w in batch for s in w.steps)
        if settles_activity and failures["left"]:
            failures["left"] -= 1
            raise DatabaseError("connection lost (injected by the test)")
        return real_commit(engine_id, batch, *args, **kwargs)

    monkeypatch.setattr(engine_module, "fenced_commit", commit)
    engine = Engine("r21-failing-engine")
    engine.start()
    try:
        _parked_with_activity_running(engine, handle.id)
        failures["left"] = 1
        tick_until(
            engine,
            lambda: (
                Workflow.objects.filter(pk=handle.id, status__in=["completed", "failed"]).exists()
                or Workflow.objects.filter(pk=handle.id, stuck_error__isnull=False).exists()
            ),
            "the run to end or be stuck",
        )
    finally:
        engine.shutdown()
    row = Workflow.objects.get(pk=handle.id)
    assert row.stuck_error is None, row.stuck_error
    assert failures["left"] == 0  # the injected failure happened
    # The activity ran twice (the first result was never durable); the second value (1) took the
    # sleep branch, and the update that arrived for the first branch was never answered.
    assert (row.status, handle.result(timeout=5)) == ("completed", ["slept", 1])
    assert _update_status(handle.id) == "failed"  # closed by the run's end, never "completed"


def _ask_when_the_outcome_waits(monkeypatch: Any, workflow_id: str, query: str, seq: int) -> list[tuple[Any, Any]]:
    """Run an engine to the workflow's gated step 0, let its outcome arrive, ask ``query`` in the
    pass that settles it, and return [(the answer, the status of step ``seq`` in the database when
    it was answered)]."""
    engine = Engine(f"{workflow_id}-engine")
    answered: list[tuple[Any, Any]] = []
    real_answer = messages._answer

    def answer(eng: Engine, wid: str, *args: Any) -> dict[str, Any]:
        fields = real_answer(eng, wid, *args)
        answered.append((fields.get("result"), _step(wid, seq)))
        return fields

    monkeypatch.setattr(messages, "_answer", answer)
    engine.start()
    try:
        tick_until(engine, lambda: _step(workflow_id, 0) == "running" and engine.executor.running, "step 0 running")
        GATE.set()
        _outcome_waiting(engine)
        QueryRequest.objects.create(
            workflow_id=workflow_id, engine_id=engine.engine_id, name=query, created_at=db_now(), deadline=db_now()
        )
        engine._queries_waiting = True
        tick_until(engine, lambda: answered, "the query to be answered")
    finally:
        engine.shutdown()
    return answered


def test_a_query_is_answered_only_from_durable_state(monkeypatch):
    """A query served in the pass that settled the activity answers from state the database holds
    (on 2ae2264 it answered 0 while step 0 was still running in the database)."""
    handle = weft.start("tests.r21_flip_then_approve", id="r21-query")
    assert _ask_when_the_outcome_waits(monkeypatch, handle.id, "a", 0) == [("0", "completed")]


def test_a_refused_atomic_attempt_of_an_old_context_does_not_drop_the_reloaded_one():
    """Item 4: after a reload at the same epoch the new context's attempt has the old one's key
    (run, seq, attempt, epoch). The old attempt's refused outcome must not drop the new context (on
    2ae2264 it did, and the workflow waited for its own claim to expire, about 40 s at defaults)."""
    handle = weft.start("tests.r21_flip_then_approve", id="r21-reload")
    engine = Engine("r21-reload-engine")
    engine.start()
    try:
        tick_until(engine, lambda: _step(handle.id, 0) == "running" and engine.executor.running, "step 0 running")
        old_task = engine.owned[handle.id].inflight[0]
        # A database error in a pass: every workflow is dropped and reloaded at the same epoch.
        engine._reload[handle.id] = engine.owned[handle.id].epoch
        engine._drop(handle.id, reason=None)
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].inflight, "the reload")
        new_task = engine.owned[handle.id].inflight[0]
        assert new_task is not old_task and new_task.key == old_task.key
        engine.executor.outcomes.put(AttemptOutcome(old_task, ok=False, refused=True))
        engine.tick()
        assert engine.owned.get(handle.id) is not None, "the old attempt's refusal dropped the reloaded workflow"
        assert engine.owned[handle.id].inflight.get(0) is new_task
    finally:
        engine.shutdown()


def test_a_refused_atomic_attempt_reloads_its_workflow_at_once():
    """Item 4, the other half: a refusal of the current attempt reloads the workflow from the durable
    log in the next passes (on 2ae2264 it was dropped and left to its claim's expiry)."""
    handle = weft.start("tests.r21_flip_then_approve", id="r21-requeue")
    engine = Engine("r21-requeue-engine")
    engine.start()
    try:
        tick_until(engine, lambda: _step(handle.id, 0) == "running" and engine.executor.running, "step 0 running")
        task = engine.owned[handle.id].inflight[0]
        engine.executor.outcomes.put(AttemptOutcome(task, ok=False, refused=True))
        engine.tick()
        assert handle.id not in engine.owned or engine.owned[handle.id].inflight.get(0) is not task
        for _ in range(5):
            engine.tick()
        assert handle.id in engine.owned, "the workflow was dropped and not reloaded"
    finally:
        engine.shutdown()


# -- found by the review of the fix ---------------------------------------------------------------

MEMOS = itertools.count(100)


@weft.activity(atomic=True)
def r21_atomic() -> int:
    GATE.wait(30)
    return 7


@weft.workflow(name="tests.r21_atomic_then_memo")
def atomic_then_memo(ctx: Any) -> Any:
    state: dict[str, Any] = {"m": None}
    ctx.on_query("m", lambda: state["m"])
    yield ctx.run(r21_atomic)  # its step is committed by the activity itself, not by the pass
    state["m"] = yield ctx.memo("m", lambda: next(MEMOS))  # recorded in memory when the outcome settles
    yield ctx.wait_for_signal("end")
    return state["m"]


def test_a_query_after_a_self_committed_outcome_answers_only_durable_memos(monkeypatch):
    """An atomic activity commits its own step, so its outcome leaves no writes in the pass; the
    generator's memo step sits in memory only. The query must not answer from that memo before it
    is durable (the review found it answered 100 with no memo step in the database)."""
    handle = weft.start("tests.r21_atomic_then_memo", id="r21-memo-query")
    (value, memo_step), *_ = _ask_when_the_outcome_waits(monkeypatch, handle.id, "m", 1)
    assert value is None or memo_step == "completed", (value, memo_step)


def test_a_refused_atomic_attempt_of_a_cancelled_run_is_released_not_a_crash():
    """The refusal reloads the workflow; by then it was cancelled: the reload releases it and the
    engine goes on (the first version of the fix died here with a NameError)."""
    handle = weft.start("tests.r21_flip_then_approve", id="r21-refused-cancelled")
    other = weft.start("tests.r21_flip_then_approve", id="r21-bystander")
    engine = Engine("r21-refused-cancel-engine")
    engine.start()
    try:
        tick_until(engine, lambda: _step(handle.id, 0) == "running" and len(engine.executor.running) == 2, "running")
        task = engine.owned[handle.id].inflight[0]
        weft.cancel(handle.id, "gone")
        engine.executor.outcomes.put(AttemptOutcome(task, ok=False, refused=True))
        for _ in range(5):
            engine.tick()
        assert handle.id not in engine.owned and other.id in engine.owned
    finally:
        GATE.set()
        engine.shutdown()
    assert Workflow.objects.get(pk=handle.id).status == "cancelled"


def test_deferred_writes_are_retried_after_carry_retry_not_only_on_the_next_poll():
    """A pass that only carries writes is quiet until CARRY_RETRY has passed, then not quiet: the
    loop neither spins on them nor leaves them for a whole POLL_INTERVAL (the review measured 35,179
    empty loop passes in 0.5 s and a retry per poll)."""
    handle = weft.start("tests.r21_flip_then_approve", id="r21-carry-quiet")
    engine = Engine("r21-carry-quiet-engine")
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].inflight, "the claim")
        for _ in range(3):
            engine.tick()  # settle the start-up scans so only the carried writes are left
        owned = engine.owned[handle.id]
        from weft_django.store.commit import WorkflowWrites

        engine._carried = {handle.id: WorkflowWrites(handle.id, owned.run_id, owned.epoch, clear_stuck=True)}
        engine._carry_retry_at = time.monotonic() + 60
        engine._last_maintenance = time.monotonic()
        engine.claimer.last_takeover_scan = engine.claimer.last_claim_scan = time.monotonic()
        engine._queries_waiting = False
        assert engine._quiet(claim=False), "not due yet: a pass would find nothing to do"
        engine._carry_retry_at = time.monotonic() - 0.001
        assert not engine._quiet(claim=False), "due: the next pass must retry the deferred commit"
        engine.tick()
        assert not engine._carried  # nothing holds the row now: it committed
    finally:
        GATE.set()
        engine.shutdown()
