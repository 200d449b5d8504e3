"""A ``ctx.patched`` call on the live path costs what it does, not what the run's history holds.

Before the fix, each change's first call past the recorded history asked whether the run had
recorded anything at its position or later by walking every recorded step, timer and applied
update (engine/markers.py ``_recorded_from``): a run that takes n changes as it goes (a marker each)
walked n * n / 2 steps, on the engine loop's thread. A live run of 8,000 changes, each followed by a
memo, took 31.4 s of one pass (27.3 s of it in that walk); see the commit for the figure after. The
walk is counted here, not timed: the run's step table counts every step an iteration visits."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import weft_django as weft
from weft_django.codec import encode
from weft_django.context import WorkflowContext
from weft_django.engine.driver import WorkflowRun
from weft_django.registry import resolve_workflow
from weft_django.store.histories import StepRecord

from .test_long_history_cost import _CountedSteps, driven

CHANGES = 2_000


@weft.workflow(name="tests.patch_marker_cost")
def patching(ctx: Any, n: int) -> Any:
    total = 0
    for i in range(n):
        if ctx.patched(f"change-{i}"):
            total += yield ctx.memo(f"k{i}", lambda: 1)
    return total


def _run(steps: dict[int, StepRecord]) -> WorkflowRun:
    run = driven(patching, [CHANGES], steps)
    return run


def test_live_patch_markers_walk_the_steps_a_bounded_number_of_times() -> None:
    steps = _CountedSteps()
    run = _run(steps)
    assert run.result_text == str(CHANGES)
    assert len(steps) == 2 * CHANGES  # a marker and a memo per change
    assert [step.kind for step in run.new_steps[:2]] == ["patch", "memo"]
    assert steps.visits <= 10 * CHANGES, f"{steps.visits:,} step visits to take {CHANGES:,} changes live"


def test_a_change_recorded_later_in_the_history_is_the_old_branch() -> None:
    # Recorded by code before the changes: memos only. Each call finds a step at or past its position,
    # so every change answers False and nothing is recorded.
    recorded = {seq: StepRecord(seq, "memo", f"k{seq}", "completed", "1") for seq in range(CHANGES)}
    run = _run(recorded)
    assert run.result_text == "0"
    assert run.new_steps == []


def test_a_change_before_a_recorded_timer_is_the_old_branch() -> None:
    # Nothing recorded at the call's position, but a timer armed past it (the loader's occupied
    # positions): the run was recorded by code before the change.
    seen: list[bool] = []

    @weft.workflow(name="tests.patch_marker_before_timer")
    def before_timer(ctx: Any) -> Any:
        seen.append(ctx.patched("change"))
        yield ctx.sleep("1h")
        return None

    ctx = WorkflowContext(
        workflow_id="patch-timer",
        run_id="patch-timer-run",
        workflow_type="tests.patch_marker_before_timer",
        started_at=datetime(2026, 12, 7, tzinfo=UTC),
        epoch=1,
    )
    run = WorkflowRun(resolve_workflow(before_timer), ctx, encode({"args": [], "kwargs": {}}), {})
    run.occupied = {0: "sleep"}
    run.start()
    assert seen == [False]
    assert run.new_steps == []
    assert [leaf.seq for leaf in run.pending_leaves()] == [0]
