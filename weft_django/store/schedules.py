"""Schedule rows: upsert, pause, resume, due schedules for the firing chore."""

from __future__ import annotations

from collections.abc import Iterable

from ..models import Schedule

# -- client side (start, handles, transitions, schedules, testing) --------------------------


def lock_schedule(schedule_id: str, using: str) -> Schedule | None:
    """The schedule row, locked until the caller's transaction ends; None when there is none."""
    row: Schedule | None = Schedule.objects.using(using).select_for_update().filter(pk=schedule_id).first()
    return row


def read_schedule(schedule_id: str, using: str) -> Schedule | None:
    """The schedule row as committed (no lock); None when there is none."""
    row: Schedule | None = Schedule.objects.using(using).filter(pk=schedule_id).first()
    return row


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
