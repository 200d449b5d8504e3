"""The schedules API: ``weft.schedule()`` (an idempotent upsert by id), ``get_schedule`` and
``ScheduleHandle`` (pause, resume, trigger, update, delete, describe). Each joins the caller's
transaction on the WEFT database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from .. import transitions
from ..client import WorkflowHandle
from ..conf import database_alias
from ..exceptions import InvalidScheduleError, ScheduleNotFoundError
from ..models import Schedule
from ..registry import registry
from ..store import schedules as rows
from ..store.clock import db_now
from ..validation import validate_note
from .fields import _TIMING_FIELDS, _fields, retime, stored_argument, stored_arguments, validate_schedule_id
from .occurrences import active_runs, cancel_waiting, fire
from .timing import _UNSET, QUEUED, STARTED, Timing, check_timing_readable, manual_id


def _alias() -> str:
    return database_alias()


def _locked(schedule_id: str, using: str) -> Schedule:
    row = rows.lock_schedule(schedule_id, using)
    if row is None:
        raise ScheduleNotFoundError(f'No schedule "{schedule_id}" exists (never created, or deleted). Check the id.')
    return row


def _save(row: Schedule, values: dict[str, Any], now: datetime, using: str) -> None:
    changed = [name for name, value in values.items() if getattr(row, name) != value]
    if not changed:
        return  # an idempotent re-declaration (e.g. at every deploy) keeps the next fire time
    for name in changed:
        setattr(row, name, values[name])
    timing = set(changed) & set(_TIMING_FIELDS)
    if row.cron is None:  # only a cron is read in the time zone: an interval keeps its phase
        timing.discard("timezone")
    if timing or rows.unreadable(row) & set(rows.TIMING_MOMENTS):  # a next fire time Python cannot hold
        retime(row, now)
    row.updated_at = now
    rows.save_schedule(row, [*changed, "next_nominal_at", "next_fire_at", "updated_at"], using)


def schedule(
    workflow: Any,
    *,
    id: str,
    cron: str | None = None,
    every: Any = None,
    timezone: str = "UTC",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    overlap: str = "skip",
    backfill: bool = False,
    jitter: Any = None,
) -> ScheduleHandle:
    """Create or update schedule ``id`` (an idempotent upsert that keeps the pause state, the missed
    count and, when the timing is unchanged, the next fire time). Joins the caller's transaction.

    Exactly one of ``cron`` (five fields, evaluated in ``timezone``) and ``every`` (whole seconds, at
    least 1; the first fire is one period after creation). Invalid arguments raise
    InvalidScheduleError (or PayloadNotSerializableError for ``args`` / ``kwargs``) before anything is
    written.
    """
    schedule_id = validate_schedule_id(id)
    values = {
        "workflow": workflow,
        "cron": cron,
        "every": every,
        "timezone": timezone,
        "args": args,
        "kwargs": kwargs,
        "overlap": overlap,
        "backfill": backfill,
        "jitter": jitter,
    }
    fields = _fields(schedule_id, values)
    using = _alias()
    for _ in range(transitions.MAX_ATTEMPTS):
        try:
            with transaction.atomic(using=using):
                row = rows.lock_schedule(schedule_id, using)
                now = db_now(using)
                if row is not None:
                    _save(row, fields, now, using)
                    return ScheduleHandle(schedule_id)
                row = Schedule(id=schedule_id, created_at=now, updated_at=now, **fields)
                retime(row, now)
                rows.insert_schedule(row, using)
                return ScheduleHandle(schedule_id)
        except IntegrityError:
            continue  # created concurrently: update it on the next attempt
    raise InvalidScheduleError(f'Schedule "{schedule_id}" kept changing while it was being saved; try again.')


def get_schedule(id: str) -> ScheduleHandle:
    """A handle for schedule ``id``; ScheduleNotFoundError if there is none."""
    schedule_id = validate_schedule_id(id)
    if not rows.schedule_exists(schedule_id, _alias()):
        raise ScheduleNotFoundError(f'No schedule "{schedule_id}" exists (never created, or deleted). Check the id.')
    return ScheduleHandle(schedule_id)


class ScheduleHandle:
    """A reference to schedule ``id``. Every method reads or writes fresh; each joins the caller's
    transaction on the WEFT database."""

    __slots__ = ("id",)

    def __init__(self, id: str) -> None:
        self.id = validate_schedule_id(id)

    def __repr__(self) -> str:
        return f"<ScheduleHandle {self.id!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScheduleHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash((ScheduleHandle, self.id))

    def pause(self, note: str = "") -> None:
        """Stop firing until resume(); occurrences meanwhile are neither fired nor counted as missed."""
        validate_note(note, InvalidScheduleError)
        using = _alias()
        with transaction.atomic(using=using):
            row = _locked(self.id, using)
            if not row.paused or row.note != note:
                row.paused, row.note, row.next_fire_at, row.updated_at = True, note, None, db_now(using)
                rows.save_schedule(row, ["paused", "note", "next_fire_at", "updated_at"], using)

    def resume(self) -> None:
        """Fire again from the next occurrence after now (the ones passed while paused are dropped).
        UnusableScheduleError (nothing written) when the stored timing cannot be used."""
        using = _alias()
        with transaction.atomic(using=using):
            row = _locked(self.id, using)
            if not row.paused:
                return
            now = db_now(using)
            timing = Timing.of(row)
            nominal = timing.upcoming(row.next_nominal_at or timing.first_after(now), now)
            row.paused, row.note, row.updated_at = False, "", now
            row.next_nominal_at, row.next_fire_at = nominal, timing.fire_at(nominal)
            rows.save_schedule(row, ["paused", "note", "next_nominal_at", "next_fire_at", "updated_at"], using)

    def trigger(self) -> WorkflowHandle | None:
        """Start a run now with the id ``f"{id}@manual-<8 hex>"``, even while paused, subject to the
        overlap policy. Returns its handle, or None when the policy skipped it. UnusableScheduleError
        (nothing written) when the stored args or kwargs do not decode."""
        using = _alias()
        workflow_id = manual_id(self.id)
        with transaction.atomic(using=using):
            row = _locked(self.id, using)
            definition = registry.workflow(row.workflow_type)
            now = db_now(using)
            outcome = fire(row, workflow_id, definition, now, using)
            if outcome in (STARTED, QUEUED):
                row.last_fired_at = now
                rows.save_schedule(row, ["last_fired_at"], using)
        return WorkflowHandle(workflow_id) if outcome in (STARTED, QUEUED) else None

    def update(
        self,
        workflow: Any = _UNSET,
        *,
        cron: Any = _UNSET,
        every: Any = _UNSET,
        timezone: Any = _UNSET,
        args: Any = _UNSET,
        kwargs: Any = _UNSET,
        overlap: Any = _UNSET,
        backfill: Any = _UNSET,
        jitter: Any = _UNSET,
    ) -> None:
        """Change some of the arguments of weft.schedule(); the others keep their values. Passing
        ``cron`` switches an interval schedule to cron (and ``every`` the reverse). A timing change
        (cron, every, timezone, jitter) re-plans from now; the pause state is kept. A stored args or
        kwargs column is decoded only when it is kept, so passing new ones repairs undecodable text."""
        given = {
            "workflow": workflow,
            "cron": cron,
            "every": every,
            "timezone": timezone,
            "args": args,
            "kwargs": kwargs,
            "overlap": overlap,
            "backfill": backfill,
            "jitter": jitter,
        }
        changes = {name: value for name, value in given.items() if value is not _UNSET}
        using = _alias()
        with transaction.atomic(using=using):
            row = _locked(self.id, using)
            current: dict[str, Any] = {
                "workflow": row.workflow_type,
                "cron": row.cron,
                "every": row.every,
                "timezone": row.timezone,
                "overlap": row.overlap,
                "backfill": row.backfill,
                "jitter": timedelta(milliseconds=row.jitter_ms),
            }
            for column in ("args", "kwargs"):  # decoded only when kept: new ones repair undecodable text
                if column not in changes:
                    current[column] = stored_argument(row, column)
            if "cron" in changes or "every" in changes:
                current["cron"] = current["every"] = None
            _save(row, _fields(self.id, {**current, **changes}), db_now(using), using)

    def delete(self) -> None:
        """Delete the schedule. Runs it started go on; a run waiting under overlap="queue" is cancelled."""
        using = _alias()
        with transaction.atomic(using=using):
            row = _locked(self.id, using)
            cancel_waiting(row.id, f'schedule "{row.id}" was deleted', using)
            rows.delete_schedule(row, using)

    def describe(self) -> dict[str, Any]:
        """id, workflow_type, cron, every, timezone, args, kwargs, overlap, backfill, jitter, paused, note,
        next_fire_times (the next five, UTC; empty while paused), last_fired_at, missed_fire_count,
        running_ids (the active runs: running, pending or suspended). UnusableScheduleError for a row
        edited by hand that cannot be used (its message names the column and the repair)."""
        using = _alias()
        row = rows.read_schedule(self.id, using)
        if row is None:
            raise ScheduleNotFoundError(f'No schedule "{self.id}" exists (never created, or deleted). Check the id.')
        if not row.paused:
            check_timing_readable(row)
        next_fire_times = _next_fire_times(row, using)
        args, kwargs = stored_arguments(row)
        return {
            "id": row.id,
            "workflow_type": row.workflow_type,
            "cron": row.cron,
            "every": row.every,
            "timezone": row.timezone,
            "args": args,
            "kwargs": kwargs,
            "overlap": row.overlap,
            "backfill": row.backfill,
            "jitter": timedelta(milliseconds=row.jitter_ms) if row.jitter_ms else None,
            "paused": row.paused,
            "note": row.note,
            "next_fire_times": next_fire_times,
            "last_fired_at": row.last_fired_at,
            "missed_fire_count": row.missed_fire_count,
            "running_ids": [run["id"] for run in active_runs(row.id, using)],
        }


def next_fire_times(row: Schedule, now: datetime) -> list[datetime]:
    """The row's next five fire times after ``now`` (UTC; empty while paused), as describe() gives
    them. UnusableScheduleError when its stored timing cannot be used (the admin shows the reason)."""
    if row.paused or row.next_nominal_at is None:
        return []
    timing = Timing.of(row)
    return [moment.astimezone(UTC) for moment in timing.fire_times(timing.upcoming(row.next_nominal_at, now))]


def _next_fire_times(row: Schedule, using: str) -> list[datetime]:
    return next_fire_times(row, db_now(using)) if not row.paused and row.next_nominal_at is not None else []
