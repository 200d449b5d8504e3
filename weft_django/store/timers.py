"""Timer rows: arm, fire, delete, and the orphaned-timer sweep."""

from __future__ import annotations

from ..models import Timer, Workflow
from ..status import TERMINAL_STATUSES, TimerKind
from .backend import backend
from .sessions import write_unlocked

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


def timers_after(after: int, limit: int, using: str) -> list[tuple[int, str]]:
    """The next ``limit`` timers (schedule timers excepted) in primary-key order after ``after``: an
    index range scan with LIMIT. Returns (pk, workflow id) rows."""
    return list(
        Timer.objects.using(using)
        .filter(pk__gt=after)
        .exclude(kind=TimerKind.SCHEDULE)
        .order_by("pk")
        .values_list("pk", "workflow_id")[:limit]
    )


def live_workflows(workflow_ids: set[str], using: str) -> set[str]:
    """Which of these workflows exist and are not terminal (looked up by primary key)."""
    runs = Workflow.objects.using(using).exclude(status__in=list(TERMINAL_STATUSES))
    return {
        wid
        for chunk in backend(using).chunks(sorted(workflow_ids))
        for wid in runs.filter(pk__in=chunk).values_list("pk", flat=True)
    }


def delete_timers(pks: list[int], using: str) -> int:
    """Delete these timers, leaving those another transaction holds (a user's open transaction) for a
    later sweep: the sweep runs on the engine's loop, which must never wait for a row. Returns how many
    were deleted."""
    return sum(
        write_unlocked(Timer.objects.using(using).filter(pk__in=chunk), None, using)
        for chunk in backend(using).chunks(pks)
    )
