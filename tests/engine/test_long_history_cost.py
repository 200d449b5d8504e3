"""A run's turns cost what they do, not what its history holds: driving a run of n steps, live or
replayed (a takeover, a recall of an evicted workflow, ``weft replay``), walks its step table O(n)
times in all, not once per turn; settling a ctx.all of n branches walks its branches O(n) times in
all, not once per branch.

Before the fix, every turn of the generator set ``ctx.is_replaying`` by scanning every recorded step
(``any(seq >= next_seq for seq in steps)``): n * n / 2 step visits for a run of n steps, all on the
engine loop's thread. A live run of 16,000 memo steps took 14.4 s of one pass (0.96 s after), and every
recovery of a long history held every other workflow of its engine that long. Settling each branch of
a fan-out looked for its leaf and for a leaf still waiting among all of them: a ctx.all of 16,000
local activities took 26.5 s of one pass (1.8 s after), of regular ones 17.8 s (2.3 s). The walks are
counted here, not timed: the run's step table (the fan-out's list of leaves) counts every step (leaf)
an iteration over it visits."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import weft_django as weft
from weft_django.codec import encode
from weft_django.context import WorkflowContext
from weft_django.engine.driver import WorkflowRun
from weft_django.engine.frontier import Frontier
from weft_django.registry import resolve_workflow
from weft_django.store.histories import Outcome, StepRecord

STEPS = 2_000


@weft.workflow(name="tests.long_history_memos")
def memos(ctx: Any, n: int) -> Any:
    total = 0
    for i in range(n):
        total += yield ctx.memo(f"k{i}", lambda: 1)
    return total


@weft.activity
def long_history_echo(value: Any) -> Any:
    return value


@weft.workflow(name="tests.long_history_fan_out")
def fan_out(ctx: Any, n: int) -> Any:
    values = yield ctx.all([ctx.run(long_history_echo, i) for i in range(n)])
    return sum(values)


class _CountedSteps(dict[int, StepRecord]):
    """A run's step table that counts the steps every iteration over it visits."""

    visits = 0

    def __iter__(self) -> Iterator[int]:
        for seq in super().__iter__():
            self.visits += 1
            yield seq


def driven(workflow: Any, args: list[Any], steps: dict[int, StepRecord]) -> WorkflowRun:
    """A WorkflowRun of ``workflow`` over ``steps`` (the dict it keeps), started: replayed to its frontier."""
    definition = resolve_workflow(workflow)
    ctx = WorkflowContext(
        workflow_id=f"{definition.name}-id",
        run_id=f"{definition.name}-run",
        workflow_type=definition.name,
        started_at=datetime(2026, 12, 7, tzinfo=UTC),
        epoch=1,
    )
    run = WorkflowRun(definition, ctx, encode({"args": args, "kwargs": {}}), steps)
    run.start()
    return run


def _run(steps: _CountedSteps) -> WorkflowRun:
    run = driven(memos, [STEPS], steps)
    return run


def test_a_live_run_walks_its_steps_a_bounded_number_of_times() -> None:
    steps = _CountedSteps()
    run = _run(steps)
    assert run.result_text == str(STEPS)
    assert len(steps) == STEPS
    assert steps.visits <= 10 * STEPS, f"{steps.visits:,} step visits to drive {STEPS:,} steps live"


def test_a_replay_walks_its_steps_a_bounded_number_of_times() -> None:
    recorded = _CountedSteps(
        {seq: StepRecord(seq, "memo", f"k{seq}", "completed", "1") for seq in range(STEPS)},
    )
    run = _run(recorded)
    assert run.result_text == str(STEPS)
    assert run.new_steps == []  # every memo came from the history: nothing computed again
    assert recorded.visits <= 10 * STEPS, f"{recorded.visits:,} step visits to replay {STEPS:,} steps"


def test_is_replaying_is_true_below_the_last_recorded_step_and_false_past_it() -> None:
    seen: list[bool] = []

    @weft.workflow(name="tests.long_history_replaying")
    def replaying(ctx: Any) -> Any:
        for i in range(4):
            seen.append(ctx.is_replaying)
            yield ctx.memo(f"k{i}", lambda i=i: i)
        seen.append(ctx.is_replaying)
        return None

    recorded = {seq: StepRecord(seq, "memo", f"k{seq}", "completed", str(seq)) for seq in range(2)}
    run = driven(replaying, [], recorded)
    assert run.result_text == "null"
    # Before the yields at 0 and 1 the history holds them; past the last recorded step the code is live.
    assert seen == [True, True, False, False, False]


class _CountedLeaves(list[Any]):
    """A fan-out's leaves, counting the leaves every iteration over them visits."""

    visits = 0

    def __iter__(self) -> Iterator[Any]:
        for leaf in super().__iter__():
            self.visits += 1
            yield leaf


def test_settling_a_fan_out_walks_its_branches_a_bounded_number_of_times(monkeypatch: Any) -> None:
    counted: list[_CountedLeaves] = []
    frontier_of = WorkflowRun._frontier

    def counting(run: WorkflowRun, seq: int, op: Any) -> Frontier:
        frontier = frontier_of(run, seq, op)
        frontier.leaves = _CountedLeaves(frontier.leaves)
        counted.append(frontier.leaves)
        return frontier

    monkeypatch.setattr(WorkflowRun, "_frontier", counting)
    run = driven(fan_out, [STEPS], {})
    assert len(run.pending_leaves()) == STEPS
    before = counted[0].visits
    for seq in range(1, STEPS + 1):  # as the engine settles them: is it waiting, then its outcome
        assert run.is_pending(seq)
        run.settle(seq, Outcome(ok=True, text=encode(1)))
        assert not run.is_pending(seq)
    assert run.result_text == str(STEPS)
    visits = counted[0].visits - before
    assert visits <= 10 * STEPS, f"{visits:,} leaf visits to settle a fan-out of {STEPS:,}"
