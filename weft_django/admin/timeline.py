"""The step timeline of a workflow's change page: each step a bar on a time axis.

Positions are percentages of the axis, so the template is plain HTML and CSS. The engine records
an activity's start when its attempt is dispatched, but a wait (sleep, signal, update, wait_until,
child, all, race) only when it ends; such a bar starts where the previous step ended, which is when
the workflow reached that yield. Pending timers of a live run are drawn as dashed bars up to their
fire time, and a live run that waits with no timer gets an open "waiting" bar up to now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..models import Step, Timer, Workflow
from ..status import ACTIVE_STATUSES, WORKFLOW_SCOPED_TIMERS, StepKind, StepStatus, TimerKind, WorkflowStatus
from .formatting import format_duration, local, when_text

MAX_BARS = 200
MIN_WIDTH = 0.6  # percent: an instant step is still a visible sliver
WAIT_KINDS = frozenset(
    {StepKind.SLEEP, StepKind.SIGNAL, StepKind.UPDATE, StepKind.WAIT_UNTIL, StepKind.CHILD, StepKind.ALL, StepKind.RACE}
)
TICKS = 5


@dataclass
class Bar:
    label: str
    kind: str  # a StepKind value, or "timer" / "waiting"
    state: str  # completed, failed, running, pending, waiting
    start: datetime
    end: datetime
    detail: str = ""
    left: float = 0.0
    width: float = 0.0
    inferred_start: bool = False

    @property
    def duration(self) -> str:
        return format_duration(self.end - self.start)

    @property
    def title(self) -> str:
        since = "waited from the end of the previous step," if self.inferred_start else "from"
        start, end = (_clock(moment) for moment in (self.start, self.end))
        text = f"{self.label}: {self.state}, {self.duration} ({since} {start} to {end})"
        return text + (f" — {self.detail}" if self.detail else "")


@dataclass
class Tick:
    left: float
    label: str


@dataclass
class Timeline:
    bars: list[Bar] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    start: datetime | None = None
    end: datetime | None = None
    now_left: float | None = None  # the "now" line of a live run
    hidden: int = 0  # steps left out (only the last MAX_BARS are drawn)

    @property
    def span(self) -> str:
        return "-" if self.start is None or self.end is None else format_duration(self.end - self.start)


def _clock(moment: datetime) -> str:
    """ "14:03:07.250" in the current time zone (out of its range: in UTC, marked)."""
    text = when_text(moment, "%H:%M:%S.%f")
    return text[:12] if local(moment) is not None else text


def _step_label(step: Step) -> str:
    name = step.name.rsplit(".", 1)[-1] if step.kind == StepKind.ACTIVITY else step.name
    return f"#{step.seq} {StepKind(step.kind).label.lower() if step.kind in StepKind.values else step.kind}" + (
        f" {name}" if name else ""
    )


def _step_bar(step: Step, previous_end: datetime, now: datetime) -> Bar:
    end = step.completed_at or now
    start = step.started_at
    inferred = False
    if step.kind in WAIT_KINDS and step.completed_at is not None and start >= end - timedelta(milliseconds=1):
        start, inferred = min(previous_end, end), True
    if step.status == StepStatus.RUNNING:
        state = "running"
    elif step.status == StepStatus.FAILED:
        state = "failed"
    else:
        state = "completed"
    detail = ""
    if step.kind == StepKind.ACTIVITY and step.attempts > 1:
        detail = f"{step.attempts} attempts"
    if isinstance(step.error, dict):
        message = f"{step.error.get('type', 'Error')}: {step.error.get('message', '')}"
        if state != "failed":  # a step retried (running) or that succeeded on a retry keeps the last failure
            message = f"last failed attempt: {message}"
        detail = f"{detail}; {message}" if detail else message
    return Bar(_step_label(step), step.kind, state, start, end, detail, inferred_start=inferred)


def _timer_label(timer: Timer) -> str:
    label = TimerKind(timer.kind).label.lower() if timer.kind in TimerKind.values else timer.kind
    seq = f"#{timer.seq} " if timer.seq is not None else ""
    attempt = f" (attempt {timer.attempt})" if timer.attempt else ""
    return f"{seq}{label}{attempt}"


def build_timeline(workflow: Workflow, steps: Iterable[Step], timers: Iterable[Timer], now: datetime) -> Timeline:
    """Bars for ``steps`` (ordered by seq) and, for a live run, its pending timers and current wait."""
    # Both None only for a row whose timestamps Python cannot represent (a hand edit, store.moments).
    origin = workflow.started_at or workflow.created_at or now
    live = workflow.status in ACTIVE_STATUSES
    bars: list[Bar] = []
    previous_end = origin
    for step in steps:
        bar = _step_bar(step, previous_end, now)
        bars.append(bar)
        if step.completed_at is not None:
            previous_end = max(previous_end, step.completed_at)
    open_bars = any(bar.state == "running" for bar in bars)
    if live:
        for timer in timers:
            if timer.kind not in WORKFLOW_SCOPED_TIMERS and timer.kind != TimerKind.DELAYED_START:
                continue
            start = origin if timer.kind == TimerKind.DELAYED_START else previous_end
            when = f"fires at {when_text(timer.fire_at)}"
            bars.append(Bar(_timer_label(timer), "timer", "pending", min(start, timer.fire_at), timer.fire_at, when))
            open_bars = True
        if not open_bars and workflow.status != WorkflowStatus.PENDING:
            label = "suspended" if workflow.status == WorkflowStatus.SUSPENDED else "waiting"
            bars.append(
                Bar(
                    label,
                    "waiting",
                    "waiting",
                    previous_end,
                    max(previous_end, now),
                    "no timer: a signal, an update or a condition ends it",
                )
            )
    hidden = max(0, len(bars) - MAX_BARS)
    bars = bars[hidden:]
    if not bars:
        return Timeline(start=origin, end=workflow.finished_at or now)
    start = min([origin, *(bar.start for bar in bars)])
    end = max([workflow.finished_at or (now if live else origin), *(bar.end for bar in bars)])
    total = max((end - start).total_seconds(), 0.001)
    for bar in bars:
        bar.left = round((bar.start - start).total_seconds() / total * 100, 3)
        bar.width = round(max((bar.end - bar.start).total_seconds() / total * 100, MIN_WIDTH), 3)
        bar.left = min(bar.left, 100 - bar.width)
    ticks = [
        Tick(round(100 * i / (TICKS - 1), 3), "+" + format_duration(timedelta(seconds=total * i / (TICKS - 1))))
        for i in range(TICKS)
    ]
    now_left = round((now - start).total_seconds() / total * 100, 3) if live and start <= now <= end else None
    return Timeline(bars, ticks, start, end, now_left, hidden)
