"""Schedule rows: upsert, pause, resume, due schedules for the firing chore."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet

from ..models import Schedule, Timer, Workflow
from ..status import ACTIVE_STATUSES, TimerKind, WorkflowStatus
from .moments import readable

# -- client side (start, handles, transitions, schedules, testing) --------------------------


MOMENTS = ("next_fire_at", "next_nominal_at", "last_fired_at", "created_at", "updated_at")
TIMING_MOMENTS = ("next_fire_at", "next_nominal_at")


def _guarded(rows: QuerySet[Schedule]) -> Schedule | None:
    """The first row of ``rows`` with each timestamp read through ``store.moments.readable``: one a
    hand edit put out of Python's reach (past year 9999, ``'infinity'``) is None on the instance and
    named in its ``unreadable`` set, so the row can still be repaired, deleted or skipped with a reason
    (a plain read raised DataError from every handle method and every engine pass)."""
    stored = {f"stored_{name}": ExpressionWrapper(Q(**{f"{name}__isnull": False}), BooleanField()) for name in MOMENTS}
    readable_values = {f"readable_{name}": readable(name) for name in MOMENTS}
    row: Schedule | None = rows.defer(*MOMENTS).annotate(**readable_values, **stored).first()
    if row is not None:
        row.unreadable = set()  # type: ignore[attr-defined]
        for name in MOMENTS:
            value = getattr(row, f"readable_{name}")
            row.__dict__[name] = value  # loaded, not deferred any more
            if value is None and getattr(row, f"stored_{name}"):
                row.unreadable.add(name)  # type: ignore[attr-defined]
    return row


def unreadable(row: Schedule) -> set[str]:
    """The timestamp columns of a row from ``lock_schedule`` / ``read_schedule`` that Python cannot hold."""
    return set(getattr(row, "unreadable", ()))


def lock_schedule(schedule_id: str, using: str, *, skip_locked: bool = False) -> Schedule | None:
    """Inside a transaction: the schedule row, locked until the transaction ends; None when there is
    none (or, with ``skip_locked``, when another transaction holds it: the firing chore's case).
    Timestamps Python cannot hold are None (``unreadable``)."""
    return _guarded(Schedule.objects.using(using).select_for_update(skip_locked=skip_locked).filter(pk=schedule_id))


def read_schedule(schedule_id: str, using: str) -> Schedule | None:
    """The schedule row as committed (no lock); None when there is none. Timestamps Python cannot hold
    are None (``unreadable``)."""
    return _guarded(Schedule.objects.using(using).filter(pk=schedule_id))


def schedule_exists(schedule_id: str, using: str) -> bool:
    """Whether schedule ``schedule_id`` exists."""
    return bool(Schedule.objects.using(using).filter(pk=schedule_id).exists())


def insert_schedule(row: Schedule, using: str) -> None:
    """Insert a new schedule row; IntegrityError when its id was created meanwhile."""
    row.save(using=using, force_insert=True)


def save_schedule(row: Schedule, fields: Iterable[str], using: str) -> None:
    """Write ``fields`` of a locked schedule row."""
    row.save(using=using, update_fields=list(fields))


def delete_schedule(row: Schedule, using: str) -> None:
    """Delete a locked schedule row (the runs it started go on)."""
    row.delete(using=using)


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


def due_schedules(
    now: datetime, *, skip_types: Iterable[str], skip_ids: Iterable[str], limit: int, using: str
) -> list[Any]:
    """The ids of at most ``limit`` unpaused schedules due at ``now``, earliest first, leaving out the
    workflow types ``skip_types`` and the schedules ``skip_ids``."""
    return list(
        Schedule.objects.using(using)
        .filter(paused=False, next_fire_at__lte=now)
        .exclude(workflow_type__in=skip_types)
        .exclude(pk__in=list(skip_ids))
        .order_by("next_fire_at")
        .values_list("pk", flat=True)[:limit]
    )


def with_waiting_runs(limit: int, using: str, skip_types: Iterable[str] = ()) -> list[str]:
    """Schedules with a run queued by overlap="queue" and not released yet, whose slot is free: no
    other active run of theirs occupies it (running, suspended, released or in a queue), as
    ``schedules.occurrences.release_waiting`` requires. At most ``limit``; ``skip_types``: workflow
    types this engine cannot release (another deploy's), left to an engine that knows them. Only the
    releasable are read, so schedules blocked for long cannot hide, past ``limit``, one that freed."""
    released = Timer.objects.using(using).filter(kind=TimerKind.DELAYED_START).values("workflow_id")
    waiting = Q(status=WorkflowStatus.PENDING, start_at__isnull=True, queue__isnull=True) & ~Q(pk__in=released)
    runs = Workflow.objects.using(using).filter(schedule_id__isnull=False, status__in=list(ACTIVE_STATUSES))
    occupied = runs.exclude(waiting).values("schedule_id")
    return [
        str(schedule_id)
        for schedule_id in runs.filter(waiting)
        .exclude(schedule_id__in=occupied)
        .exclude(workflow_type__in=list(skip_types))
        .order_by()
        .values_list("schedule_id", flat=True)
        .distinct()[:limit]
    ]
