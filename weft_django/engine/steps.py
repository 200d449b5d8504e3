"""The per-workflow state transitions that need no I/O: what a step becomes when its activity
succeeds or fails, when its timer fires, when a signal or a child's end arrives; when a retry is due;
how a stuck workflow backs off; when each pending wait began. The state machine (engine/progress.py)
applies them to a workflow's live state and its writes for the next fenced commit."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from ..codec import storable_text
from ..exceptions import ActivityTimeoutError, WeftError
from ..models import Timer
from ..operations import RunActivity, Sleep, StartChild, WaitForSignal, WaitUntil
from ..status import TimerKind
from .activities import AttemptTask
from .children import child_outcome
from .driver import StepRecord, WorkflowRun
from .frontier import Leaf

logger = logging.getLogger("weft_django.engine.engine")
STUCK_MAX_BACKOFF = timedelta(minutes=5)
STUCK_MAX_COUNT = 2**31 - 1  # stuck_attempts is an integer column


def stuck_record(attempts: int, error: WeftError, now: datetime) -> tuple[dict[str, Any], timedelta]:
    """The ``WorkflowWrites.stuck`` record of a workflow stuck for the ``attempts + 1``-th time, and its
    back-off (doubling per attempt, at most STUCK_MAX_BACKOFF).

    Args:
        attempts: how often it was stuck before.
        error: why it is stuck.
        now: workflow time.
    """
    backoff = min(timedelta(seconds=2 ** min(attempts, 12)), STUCK_MAX_BACKOFF)
    record = {
        "error": {"type": type(error).__name__, "message": storable_text(str(error))},
        "retry_at": now + backoff,
        "attempts": min(attempts, STUCK_MAX_COUNT - 1) + 1,  # an odd row at the column's maximum: stays there
    }
    return record, backoff


def activity_completed(
    task: AttemptTask, result: str | None, now: datetime, error: dict[str, Any] | None = None
) -> StepRecord:
    """The step of an attempt that returned ``result`` (codec text). ``error``: the last failed
    attempt's (``retried``), kept on a step that succeeded on a retry, as the atomic and Celery paths
    keep it (they leave the column as it is)."""
    return StepRecord(
        task.seq,
        "activity",
        task.definition.name,
        "completed",
        result,
        error,
        attempts=task.attempt,
        started_at=task.started_at,
        completed_at=now,
    )


def activity_failed(task: AttemptTask, error: dict[str, Any], now: datetime) -> StepRecord:
    """The step of an activity whose last attempt failed with ``error`` (no retry left)."""
    return StepRecord(
        task.seq,
        "activity",
        task.definition.name,
        "failed",
        error={"exc": "ActivityError", **error, "attempts": task.attempt, "activity": task.definition.name},
        attempts=task.attempt,
        started_at=task.started_at,
        completed_at=now,
    )


def retried(step: StepRecord, task: AttemptTask, error: dict[str, Any]) -> None:
    """Record on a running ``step`` that ``task``'s attempt failed with ``error`` and will be retried:
    the step stays running, its error is the failed attempt's (with its number, ``attempt``), so a
    reader sees why it is retried; the next attempt's dispatch adds when it began (``dispatched``)."""
    step.error = {**error, "attempt": task.attempt}


def dispatched(step: StepRecord, now: datetime) -> None:
    """Record on a running ``step`` whose retry is dispatched now when its latest attempt began
    (``next_attempt_at`` in the failed attempt's error: the step's row has no column for it)."""
    if isinstance(step.error, dict):
        step.error = {**step.error, "next_attempt_at": now.isoformat()}


def retry_at(task: AttemptTask, retryable: bool, now: datetime) -> datetime | None:
    """When the next attempt runs after this failed one, or None: no attempt left (the retry policy's
    count, or the schedule-to-close budget counted from the step's start)."""
    policy = task.definition.retry
    budget = task.definition.schedule_to_close_timeout
    if retryable and task.attempt < policy.attempts:
        fire_at = now + policy.backoff(task.attempt)
        if budget is None or fire_at < task.started_at + budget:
            return fire_at
    return None


def timed_out(task: AttemptTask) -> tuple[dict[str, Any], bool]:
    """The error of an attempt past its timeout, and whether its retry policy retries it."""
    error = {
        "type": "ActivityTimeoutError",
        "qualified_type": "weft_django.exceptions.ActivityTimeoutError",
        "message": f"attempt {task.attempt} did not finish within {task.definition.timeout}",
        "traceback": "",
    }
    return error, task.definition.retry.is_retryable(ActivityTimeoutError(error["message"]))


def timer_fired(kind: str, seq: int, leaf: Leaf | None, now: datetime, workflow_id: str = "") -> StepRecord | None:
    """The step a fired sleep, signal-timeout or wait-condition timer settles (None for other kinds).

    Args:
        kind: the timer's kind.
        seq: the step it belongs to.
        leaf: the pending leaf at ``seq`` (a signal timeout names its signal; a wait_until's
            predicate is asked again).
        now: workflow time.
        workflow_id: its workflow (for the log of a predicate that raises).
    """
    if kind == TimerKind.SLEEP:
        return StepRecord(seq, "sleep", "", "completed", "null", completed_at=now)
    if kind == TimerKind.SIGNAL_TIMEOUT:
        assert leaf is not None
        name = leaf.op.name
        error = {"exc": "WaitTimeoutError", "message": f"No signal {name!r} arrived within the timeout."}
        return StepRecord(seq, "signal", name, "failed", error=error, completed_at=now)
    if kind == TimerKind.WAIT_CONDITION:  # asked once more: the answer at the timeout is recorded
        held = leaf is not None and isinstance(leaf.op, WaitUntil) and holds(leaf.op, workflow_id)
        return StepRecord(seq, "wait_until", "", "completed", "true" if held else "false", completed_at=now)
    return None


def holds(op: WaitUntil, workflow_id: str) -> bool:
    """Whether a ``wait_until`` predicate holds now: asked when the wait is reached, after each update
    handler, and when its timeout fires. One that raises counts as false (logged as a warning)."""
    try:
        return bool(op.predicate())
    except Exception as exc:
        logger.warning("wait_until predicate raised workflow=%s error=%s", workflow_id, exc)
        return False


def wait_satisfied(seq: int, now: datetime) -> StepRecord:
    """The step of a wait_until whose predicate holds."""
    return StepRecord(seq, "wait_until", "", "completed", "true", completed_at=now)


def child_too_deep(step: StepRecord, child_id: str, depth: int, max_depth: int, now: datetime) -> StepRecord:
    """The failed step of a child that would nest deeper than ``max_depth`` (level ``depth``)."""
    message = f"child workflows nest at most {max_depth} deep; {child_id!r} would be level {depth}"
    report = {"type": "ChildWorkflowError", "message": message}
    error = {"exc": "ChildWorkflowError", "message": message, "child_id": child_id, "status": "failed", "error": report}
    return StepRecord(step.seq, step.kind, step.name, "failed", step.result, error, step.attempts, step.started_at, now)


def delivered(leaf: Leaf, name: str, payload: str, now: datetime) -> StepRecord:
    """The step a consumed buffered record settles: a signal's payload, or a child's terminal record."""
    if isinstance(leaf.op, StartChild):
        outcome = child_outcome(payload)
        status = "completed" if outcome.ok else "failed"
        return StepRecord(
            leaf.seq, "child", leaf.op.name, status, outcome.text, outcome.error, attempts=1, completed_at=now
        )
    return StepRecord(leaf.seq, "signal", name, "completed", payload, completed_at=now)


def wait_starts(
    run: WorkflowRun, timers: dict[tuple[str, int], Timer], run_started_at: datetime | None
) -> dict[int, datetime]:
    """After a load (a takeover, a restart): when each wait pending at the replayed frontier began,
    which its step records as ``started_at`` when it settles (the admin's timeline). A sleep or a
    signal wait with a timeout began when its timer was armed (fire time - duration); any other
    wait when the workflow reached that frontier: the latest end of the steps before it (the run's
    start for a first wait). A sleep or timed wait whose timer was never armed is left out: it
    begins when this engine arms it (its timer is armed from then too)."""
    frontier = run.frontier
    if frontier is None or not frontier.leaves:
        return {}
    first = min(leaf.seq for leaf in frontier.leaves)
    ends = [step.completed_at for seq, step in run.steps.items() if seq < first and step.completed_at]
    reached = max(ends, default=run_started_at)
    began_at: dict[int, datetime] = {}
    for leaf in run.pending_leaves():
        op, began = leaf.op, reached
        if isinstance(op, Sleep):
            timer = timers.get((TimerKind.SLEEP, leaf.seq))
            began = timer.fire_at - op.duration if timer is not None else None
        elif isinstance(op, WaitForSignal) and op.timeout is not None:
            timer = timers.get((TimerKind.SIGNAL_TIMEOUT, leaf.seq))
            began = timer.fire_at - op.timeout if timer is not None else None
        if began is not None and not isinstance(op, RunActivity):
            began_at[leaf.seq] = began
    return began_at
