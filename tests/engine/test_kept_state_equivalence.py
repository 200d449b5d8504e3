"""The state kept in place of scans (8e3c5d0, 7589331) answers as the scans did: ``ctx.is_replaying``
(the highest recorded seq), a frontier's count of waiting leaves when it is built with some of them
settled (a fan-out replayed half-way, a race whose winner settled before its own step was written),
and the order in which one workflow's buffered signals are consumed (a known mailbox, then rows its
``S:`` wake-ups carried, two waits of the same name in one ``ctx.all``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.codec import encode
from weft_django.context import WorkflowContext
from weft_django.engine.driver import WorkflowRun
from weft_django.engine.engine import Engine
from weft_django.models import Workflow
from weft_django.registry import resolve_workflow
from weft_django.store.histories import Outcome, StepRecord

from .ticking import tick_until


@weft.activity
def kept_state_echo(value: Any) -> Any:
    return value


SEEN: list[tuple[str, bool]] = []


@weft.workflow(name="tests.kept_state_fan_out")
def fan_out(ctx: Any) -> Any:
    SEEN.append(("start", ctx.is_replaying))
    yield ctx.memo("m", lambda: 0)
    SEEN.append(("before all", ctx.is_replaying))
    values = yield ctx.all([ctx.run(kept_state_echo, i) for i in range(4)])
    SEEN.append(("after all", ctx.is_replaying))
    yield ctx.memo("after", lambda: 1)
    return values


@weft.workflow(name="tests.kept_state_race")
def race(ctx: Any) -> Any:
    winner, value = yield ctx.race([ctx.wait_for_signal("a"), ctx.wait_for_signal("b")])
    SEEN.append(("after race", ctx.is_replaying))
    return [winner, value]


def _run(workflow: Any, steps: dict[int, StepRecord]) -> WorkflowRun:
    ctx = WorkflowContext(
        workflow_id="kept-state",
        run_id="kept-state-run",
        workflow_type=resolve_workflow(workflow).name,
        started_at=datetime(2026, 12, 7, tzinfo=UTC),
        epoch=1,
    )
    run = WorkflowRun(resolve_workflow(workflow), ctx, encode({"args": [], "kwargs": {}}), steps)
    run.start()
    return run


def _settle(run: WorkflowRun, seq: int, value: Any) -> None:
    """As the engine settles a leaf: its step recorded, then its outcome fed to the driver."""
    step = StepRecord(seq, "activity", kept_state_echo.name, "completed", encode(value), attempts=1)
    run.record(step)
    run.settle(seq, Outcome(ok=True, text=encode(value)))


def test_a_fan_out_replayed_half_way_waits_for_its_unsettled_branches_only() -> None:
    SEEN.clear()
    name = kept_state_echo.name
    steps = {0: StepRecord(0, "memo", "m", "completed", encode(0))}
    for seq, status in ((2, "completed"), (3, "running"), (4, "completed"), (5, "running")):
        result = encode(seq - 2) if status == "completed" else None
        steps[seq] = StepRecord(seq, "activity", name, status, result, attempts=1)
    run = _run(fan_out, steps)
    assert run.stuck is None, run.stuck
    assert [leaf.seq for leaf in run.pending_leaves()] == [3, 5]
    assert not run.is_pending(2) and run.is_pending(3)
    run.settle(2, Outcome(ok=True, text=encode(99)))  # settled at build: not settled again
    _settle(run, 3, 1)
    assert run.result_text is None and [leaf.seq for leaf in run.pending_leaves()] == [5]
    _settle(run, 5, 3)
    assert run.result_text == encode([0, 1, 2, 3])
    # Replaying below the last recorded step (5), live past it.
    assert SEEN == [("start", True), ("before all", True), ("after all", False)]


def test_a_race_whose_winner_settled_before_its_race_step_resumes_at_once() -> None:
    SEEN.clear()
    steps = {2: StepRecord(2, "signal", "b", "completed", encode("B"))}
    run = _run(race, steps)
    assert run.result_text == encode([1, "B"])
    assert run.new_steps[0].seq == 0 and run.new_steps[0].kind == "race"
    assert SEEN == [("after race", False)]


@weft.workflow(name="tests.kept_state_mailbox_order")
def mailbox_order(ctx: Any) -> Any:
    pair = yield ctx.all([ctx.wait_for_signal("x"), ctx.wait_for_signal("x")])
    ys = []
    for _ in range(5):
        ys.append((yield ctx.wait_for_signal("y")))
    return [pair, ys]


@pytest.mark.django_db(transaction=True)
@override_settings(WEFT={"POLL_INTERVAL": "60s"})
def test_one_workflows_signals_are_consumed_in_the_order_they_were_buffered() -> None:
    handle = weft.start(mailbox_order, id="kept-state-order")
    for name, value in (("y", 1), ("x", "x1"), ("y", 2), ("x", "x2"), ("y", 3)):
        handle.signal(name, value)  # buffered before the load: its mailbox, read with it
    engine = Engine("kept-state-order", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned, "the workflow held")
        for _ in range(3):
            engine.tick()
        handle.signal("y", 4)  # carried by S: wake-ups while the known mailbox may hold others
        handle.signal("y", 5)
        tick_until(
            engine,
            lambda: Workflow.objects.filter(pk=handle.id, status="completed").exists(),
            "the workflow completed",
        )
        assert handle.result(timeout=5) == [["x1", "x2"], [1, 2, 3, 4, 5]]
    finally:
        engine.shutdown()
