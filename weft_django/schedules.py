"""Schedules: run a workflow on a cron expression or every N seconds (API.md §3, docs/schedules.md).

``weft.schedule()`` is an idempotent upsert by id; a ``ScheduleHandle`` pauses, resumes, triggers,
updates, deletes and describes one. Engines fire due occurrences (``engine/schedules.py``). This
module holds what both sides share: the time arithmetic (cron in an IANA time zone, intervals,
deterministic jitter) and how one occurrence becomes a run under the overlap policy.

Every occurrence has a nominal UTC time and the run id ``f"{schedule_id}@{nominal:%Y-%m-%dT%H:%M:%SZ}"``;
jitter delays when it fires, never its id. The schedule row is the occurrence timer: whoever fires
it holds the row lock (engines take it with SKIP LOCKED), starts the run and advances
``next_nominal_at`` / ``next_fire_at`` in one transaction, so an occurrence starts at most one run.
Lock order: schedule row, then claim -> workflow (as everywhere).

A run queued by ``overlap="queue"`` is a ``pending`` workflow with no ``start_at`` and no timer; when
the slot frees, an engine gives it a delayed-start timer due now and the ordinary delayed-start path
(``ownership.fire_delayed_starts``) starts it with the acquire folded in.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import heapq
import math
import uuid
import zoneinfo
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from croniter import CroniterError, croniter
from django.db import IntegrityError, transaction

from . import codec, events, transitions
from .durations import InvalidDuration, to_ms
from .epochs import next_epoch
from .exceptions import InvalidScheduleError, ScheduleNotFoundError, WorkflowTerminalError
from .models import Schedule, Timer, Workflow
from .registry import WorkflowDefinition, registry, resolve_workflow
from .status import ACTIVE_STATUSES, OverlapPolicy, TimerKind, WorkflowStatus
from .store import notify
from .store.clock import db_now
from .validation import check_text, validate_note

if TYPE_CHECKING:
    from .client import WorkflowHandle

MAX_SCHEDULE_ID_LENGTH = 200  # the run ids add 21 characters and must fit the 255 of a workflow id
MAX_EVERY_SECONDS = 2**31 - 1
MAX_JITTER_MS = 2**31 - 1
MAX_TIMEZONE_LENGTH = 64
MAX_CRON_LENGTH = 200
NEXT_FIRE_TIMES = 5
OVERLAP_POLICIES: tuple[str, ...] = tuple(str(value) for value in OverlapPolicy.values)
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Bigger than any daylight-saving shift: later cron candidates never map to instants before this margin.
_DST_MARGIN = timedelta(hours=3)
_UNSET: Any = object()

STARTED, QUEUED, SKIPPED, EXISTS = "started", "queued", "skipped", "exists"


# ------------------------------------------------------------------------------------------ timing


def occurrence_id(schedule_id: str, nominal: datetime) -> str:
    """The run id of the occurrence at ``nominal``: two engines firing it start one run."""
    return f"{schedule_id}@{nominal.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def manual_id(schedule_id: str) -> str:
    return f"{schedule_id}@manual-{uuid.uuid4().hex[:8]}"


def _ceil_second(moment: datetime) -> datetime:
    whole = moment.replace(microsecond=0)
    return whole if whole == moment else whole + timedelta(seconds=1)


@dataclass(frozen=True)
class Timing:
    """When a schedule's occurrences are: validated ``cron`` xor ``every``, zone, jitter."""

    schedule_id: str
    cron: str | None
    every: int | None
    timezone: str
    jitter_ms: int

    @classmethod
    def of(cls, row: Schedule) -> Timing:
        return cls(row.id, row.cron, row.every, row.timezone, row.jitter_ms)

    @property
    def expression(self) -> str:
        assert self.cron is not None
        return CRON_ALIASES.get(self.cron.lower(), self.cron)

    @property
    def fixed_time(self) -> bool:
        """Vixie cron's rule: a job whose minute and hour fields have no wildcard or step runs at a
        particular wall-clock time; across a daylight-saving change it fires once per matching day."""
        minute, hour = self.expression.split()[:2]
        return not any(mark in minute + hour for mark in "*/")

    def jitter(self, nominal: datetime) -> timedelta:
        """Deterministic in [0, jitter): every engine computes the same delay for an occurrence."""
        if not self.jitter_ms:
            return timedelta(0)
        digest = hashlib.sha256(occurrence_id(self.schedule_id, nominal).encode()).digest()
        return timedelta(milliseconds=int.from_bytes(digest[:8], "big") % self.jitter_ms)

    def fire_at(self, nominal: datetime) -> datetime:
        return nominal + self.jitter(nominal)

    def first_after(self, now: datetime) -> datetime:
        """The nominal time of the first occurrence of a schedule created (or re-timed) at ``now``:
        ``every`` fires one period later (from the next whole second), ``cron`` at its next match."""
        if self.every is not None:
            return _ceil_second(now) + timedelta(seconds=self.every)
        return next(self._cron_after(now))

    def following(self, nominal: datetime) -> Iterator[datetime]:
        """The nominal times after the occurrence at ``nominal``, in order."""
        if self.every is None:
            yield from self._cron_after(nominal)
            return
        period = timedelta(seconds=self.every)
        while True:
            nominal += period
            yield nominal

    def upcoming(self, nominal: datetime, now: datetime) -> datetime:
        """The first occurrence, from ``nominal`` on, that fires after ``now`` (resume, describe)."""
        if self.fire_at(nominal) > now:
            return nominal
        if self.every is not None:
            period = timedelta(seconds=self.every)
            nominal += max(0, (now - nominal - timedelta(milliseconds=self.jitter_ms)) // period) * period
            while self.fire_at(nominal) <= now:
                nominal += period
            return nominal
        start = max(nominal, now - timedelta(milliseconds=self.jitter_ms))
        return next(n for n in self._cron_after(start) if self.fire_at(n) > now)

    def fire_times(self, nominal: datetime, count: int = NEXT_FIRE_TIMES) -> list[datetime]:
        times = [self.fire_at(nominal)]
        following = self.following(nominal)
        while len(times) < count:
            times.append(self.fire_at(next(following)))
        return times

    def _cron_after(self, after: datetime) -> Iterator[datetime]:
        """UTC instants strictly after ``after`` whose wall-clock time in the zone matches the cron.

        Candidates are wall-clock times (croniter on naive datetimes: plain calendar arithmetic), each
        mapped to its instants: a wall time skipped by a forward change fires shifted by the gap
        (PEP 495 ``fold=0``: 02:30 becomes 03:30 summer time) if the job is fixed-time, and not at all
        otherwise; a wall time repeated by a backward change fires at its first occurrence if the job
        is fixed-time, and at both otherwise. Instants are buffered until no later candidate can map
        before them, then yielded once each, in order.
        """
        zone = zoneinfo.ZoneInfo(self.timezone)
        fixed = self.fixed_time
        wall = after.astimezone(zone).replace(tzinfo=None)
        candidates = croniter(self.expression, wall - _DST_MARGIN, hash_id=self.schedule_id)
        pending: list[datetime] = []
        last = after
        while True:
            candidate = candidates.get_next(datetime)
            for instant in _instants(candidate, zone, fixed):
                heapq.heappush(pending, instant)
            bound = candidate.replace(tzinfo=zone).astimezone(UTC) - _DST_MARGIN
            while pending and pending[0] <= bound:
                instant = heapq.heappop(pending)
                if instant > last:
                    last = instant
                    yield instant


def _instants(wall: datetime, zone: zoneinfo.ZoneInfo, fixed: bool) -> tuple[datetime, ...]:
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return (first,)
    if first.astimezone(zone).replace(tzinfo=None) != wall:  # in the gap of a forward change
        return (first,) if fixed else ()
    return (first,) if fixed else (first, second)  # repeated by a backward change


# -------------------------------------------------------------------------------------- validation


def _invalid(message: str) -> InvalidScheduleError:
    return InvalidScheduleError(message)


def validate_schedule_id(value: object) -> str:
    """A schedule id: a str of 1 to 200 characters, no control characters, no lone surrogates.
    Raises InvalidScheduleError otherwise."""
    hint = " It names the schedule, and its runs are called id@<time>."
    return check_text(
        value, "id", max_length=MAX_SCHEDULE_ID_LENGTH, controls=True, error=InvalidScheduleError, hint=hint
    )


def _cron(value: object, schedule_id: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _invalid(f'cron must be a cron expression such as "30 2 * * *" (got {value!r}).')
    text = check_text(value, "cron", max_length=MAX_CRON_LENGTH, error=InvalidScheduleError).strip()
    fields = CRON_ALIASES.get(text.lower(), text).split()
    if len(fields) != 5:
        raise _invalid(
            f"cron {value!r} has {len(fields)} field(s); use the five fields minute hour day-of-month month "
            f'day-of-week (e.g. "30 2 * * *") or one of {", ".join(CRON_ALIASES)}. For intervals shorter '
            f"than a minute use every= (seconds)."
        )
    for field in fields:
        for part in field.upper().split(","):
            if part == "R" or part.startswith("R("):
                raise _invalid(
                    f'cron {value!r} uses "R" (random), which would give each engine a different time; '
                    f'use "H" (a stable hash of the schedule id) or a fixed value.'
                )
    try:
        croniter(" ".join(fields), datetime(2000, 1, 1), hash_id=schedule_id)
    except (CroniterError, ValueError, KeyError) as exc:
        raise _invalid(f'cron {value!r} is not a valid cron expression ({exc}). Example: "30 2 * * *".') from None
    return text


def _every(value: object) -> int:
    if isinstance(value, bool):
        seconds: float = -1
    elif isinstance(value, int | float):
        seconds = value if math.isfinite(value) else -1
    else:
        try:
            seconds = to_ms(value, "every") / 1000
        except InvalidDuration as exc:
            raise _invalid(str(exc)) from None
    if seconds != int(seconds) or not 1 <= seconds <= MAX_EVERY_SECONDS:
        raise _invalid(
            f'every must be a whole number of seconds, at least 1 (got {value!r}); e.g. every=30, every="5m" '
            f"or every=timedelta(hours=1)."
        )
    return int(seconds)


def _timezone(value: object) -> str:
    if isinstance(value, zoneinfo.ZoneInfo):
        value = value.key
    if isinstance(value, str) and value and len(value) <= MAX_TIMEZONE_LENGTH:
        try:
            zoneinfo.ZoneInfo(value)
            return value
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            pass
    close = difflib.get_close_matches(str(value), zoneinfo.available_timezones(), n=1) if isinstance(value, str) else []
    hint = f' Did you mean "{close[0]}"?' if close else ""
    raise _invalid(f'timezone {value!r} is not an IANA time zone name; use one such as "UTC" or "Europe/Berlin".{hint}')


def _overlap(value: object) -> str:
    if value in OVERLAP_POLICIES:
        return str(value)
    close = difflib.get_close_matches(str(value).replace("-", "_"), OVERLAP_POLICIES, n=1)
    hint = f' Did you mean "{close[0]}"?' if close else ""
    raise _invalid(f"overlap must be one of {', '.join(map(repr, OVERLAP_POLICIES))} (got {value!r}).{hint}")


def _jitter(value: object) -> int:
    if value is None:
        return 0
    try:
        ms = to_ms(value, "jitter")
    except InvalidDuration as exc:
        raise _invalid(str(exc)) from None
    if not 0 <= ms <= MAX_JITTER_MS:
        raise _invalid(f"jitter must be between 0 and {MAX_JITTER_MS} ms, about 24 days (got {value!r}).")
    return ms


def _backfill(value: object) -> bool:
    if not isinstance(value, bool):
        raise _invalid(f"backfill must be True or False (got {value!r}).")
    return value


def _arguments(args: object, kwargs: object) -> tuple[str, str]:
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise _invalid(
            f"args must be a list or tuple of positional arguments (got {type(args).__name__}: {args!r:.60}); "
            f"for a single argument pass args=[value]."
        )
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(key, str) for key in kwargs):
        raise _invalid(f"kwargs must be a dict with str keys (got {kwargs!r:.60}).")
    args_text = codec.encode_payload(list(args), path="args")
    kwargs_text = codec.encode_payload(dict(kwargs), path="kwargs")
    run_input(args_text, kwargs_text)  # what each run gets must fit the size limit as well
    return args_text, kwargs_text


def run_input(args_text: str, kwargs_text: str) -> str:
    """The input of a run: codec text of {"args": [...], "kwargs": {...}}, as weft.start() writes it."""
    return codec.encode_payload({"args": codec.decode(args_text), "kwargs": codec.decode(kwargs_text)}, path="input")


def validate_schedule(schedule_id: str, values: Mapping[str, Any]) -> None:
    """Check what ``weft.schedule(id=schedule_id, **values)`` checks before it writes, without writing
    (the admin's schedule form uses it). ``values`` holds every argument of weft.schedule() but ``id``.
    Raises InvalidScheduleError, WorkflowNotRegisteredError or a payload error, as weft.schedule would."""
    _fields(validate_schedule_id(schedule_id), values)


def _fields(schedule_id: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the arguments of weft.schedule() into Schedule column values (nothing is written)."""
    cron, every = values["cron"], values["every"]
    if (cron is None) == (every is None):
        raise _invalid(
            'Pass exactly one of cron (e.g. cron="30 2 * * *") and every (seconds, e.g. every=60)'
            + (", not both." if cron is not None else "; neither was given.")
        )
    fields: dict[str, Any] = {
        "workflow_type": resolve_workflow(values["workflow"]).name,
        "cron": None if cron is None else _cron(cron, schedule_id),
        "every": None if every is None else _every(every),
        "timezone": _timezone(values["timezone"]),
        "overlap": _overlap(values["overlap"]),
        "backfill": _backfill(values["backfill"]),
        "jitter_ms": _jitter(values["jitter"]),
    }
    fields["args"], fields["kwargs"] = _arguments(values["args"], values["kwargs"])
    timing = Timing(schedule_id, fields["cron"], fields["every"], fields["timezone"], fields["jitter_ms"])
    try:
        timing.first_after(datetime.now(UTC))
    except (CroniterError, ValueError, StopIteration) as exc:
        raise _invalid(f"cron {cron!r} never matches a date ({exc}); check its day and month fields.") from None
    return fields


_TIMING_FIELDS = ("cron", "every", "timezone", "jitter_ms")


def retime(row: Schedule, now: datetime) -> None:
    """Point the schedule at its first occurrence after ``now`` (new, or its timing changed); not saved."""
    timing = Timing.of(row)
    row.next_nominal_at = timing.first_after(now)
    row.next_fire_at = None if row.paused else timing.fire_at(row.next_nominal_at)


# ------------------------------------------------------------------------------------------- firing


def active_runs(schedule_id: str, using: str) -> list[dict[str, Any]]:
    """The schedule's runs that are still active (running, pending or suspended: a suspended run still
    occupies the slot), oldest first, each with ``waiting``: queued by overlap="queue", not released."""
    runs: list[dict[str, Any]] = [
        dict(run)
        for run in Workflow.objects.using(using)
        .filter(schedule_id=schedule_id, status__in=list(ACTIVE_STATUSES))
        .order_by("created_at", "pk")
        .values("id", "run_id", "status", "start_at")
    ]
    pending = [run["id"] for run in runs if run["status"] == WorkflowStatus.PENDING and run["start_at"] is None]
    released = set(
        Timer.objects.using(using)
        .filter(workflow_id__in=pending, kind=TimerKind.DELAYED_START)
        .values_list("workflow_id", flat=True)
    )
    for run in runs:
        run["waiting"] = run["id"] in pending and run["id"] not in released
    return runs


def release_waiting(runs: list[dict[str, Any]], now: datetime, using: str) -> str | None:
    """When no run occupies the slot, release the oldest queued run: a delayed-start timer due now,
    which any engine's delayed-start pass turns into a running run with its claim. Returns its id."""
    if any(not run["waiting"] for run in runs):
        return None
    waiting = [run for run in runs if run["waiting"]]
    if not waiting:
        return None
    run = waiting[0]
    Timer(workflow_id=run["id"], run_id=run["run_id"], kind=TimerKind.DELAYED_START, fire_at=now).save(using=using)
    run["waiting"] = False
    notify.send("w", run["id"], using)
    return str(run["id"])


def _insert_run(
    row: Schedule, workflow_id: str, definition: WorkflowDefinition, now: datetime, using: str, *, queued: bool
) -> bool:
    """Insert the run (running, or pending when queued) with an unheld claim. False if the id exists:
    that occurrence already has its run (use_existing)."""
    if Workflow.objects.using(using).filter(pk=workflow_id).exists():
        return False
    run = Workflow(
        id=workflow_id,
        run_id=uuid.uuid4(),
        workflow_type=definition.name,
        version=definition.version,
        status=WorkflowStatus.PENDING if queued else WorkflowStatus.RUNNING,
        input=run_input(row.args, row.kwargs),
        schedule_id=row.id,
        created_at=now,
        updated_at=now,
        started_at=None if queued else now,
    )
    try:
        with transaction.atomic(using=using):
            run.save(using=using, force_insert=True)
    except IntegrityError:
        return False
    transitions.write_claim(workflow_id, next_epoch(using), using)
    if not queued:
        notify.send("w", workflow_id, using)
    events.workflow_started(run, using)
    return True


def fire(row: Schedule, workflow_id: str, definition: WorkflowDefinition, now: datetime, using: str) -> str:
    """Turn one occurrence into a run under the overlap policy, in the caller's transaction (which
    holds the schedule row). Returns STARTED, QUEUED, SKIPPED, or EXISTS (the run id is taken)."""
    policy = row.overlap
    runs = [] if policy == OverlapPolicy.ALLOW else active_runs(row.id, using)
    if runs and policy == OverlapPolicy.SKIP:
        return SKIPPED
    if runs and policy == OverlapPolicy.QUEUE:
        if any(run["waiting"] for run in runs):
            return SKIPPED  # one occurrence waits already: this one is dropped
        return QUEUED if _insert_run(row, workflow_id, definition, now, using, queued=True) else EXISTS
    if runs and policy == OverlapPolicy.CANCEL_RUNNING:
        reason = f'schedule "{row.id}" started {workflow_id} (overlap="cancel_running")'
        for run in runs:
            with contextlib.suppress(WorkflowTerminalError):  # it ended meanwhile
                transitions.cancel(run["id"], reason, using=using)
    return STARTED if _insert_run(row, workflow_id, definition, now, using, queued=False) else EXISTS


# ------------------------------------------------------------------------------------------ the API


def _alias() -> str:
    from .conf import database_alias

    return database_alias()


def _locked(schedule_id: str, using: str) -> Schedule:
    row = Schedule.objects.using(using).select_for_update().filter(pk=schedule_id).first()
    if row is None:
        raise ScheduleNotFoundError(f'No schedule "{schedule_id}" exists (never created, or deleted). Check the id.')
    return row


def _save(row: Schedule, values: dict[str, Any], now: datetime, using: str) -> None:
    changed = [name for name, value in values.items() if getattr(row, name) != value]
    if not changed:
        return  # an idempotent re-declaration (e.g. at every deploy) keeps the next fire time
    for name in changed:
        setattr(row, name, values[name])
    if set(changed) & set(_TIMING_FIELDS):
        retime(row, now)
    row.updated_at = now
    row.save(using=using, update_fields=[*changed, "next_nominal_at", "next_fire_at", "updated_at"])


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
                row = Schedule.objects.using(using).select_for_update().filter(pk=schedule_id).first()
                now = db_now(using)
                if row is not None:
                    _save(row, fields, now, using)
                    return ScheduleHandle(schedule_id)
                row = Schedule(id=schedule_id, created_at=now, updated_at=now, **fields)
                retime(row, now)
                row.save(using=using, force_insert=True)
                return ScheduleHandle(schedule_id)
        except IntegrityError:
            continue  # created concurrently: update it on the next attempt
    raise InvalidScheduleError(f'Schedule "{schedule_id}" kept changing while it was being saved; try again.')


def get_schedule(id: str) -> ScheduleHandle:
    """A handle for schedule ``id``; ScheduleNotFoundError if there is none."""
    schedule_id = validate_schedule_id(id)
    if not Schedule.objects.using(_alias()).filter(pk=schedule_id).exists():
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
                row.save(using=using, update_fields=["paused", "note", "next_fire_at", "updated_at"])

    def resume(self) -> None:
        """Fire again from the next occurrence after now (the ones passed while paused are dropped)."""
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
            row.save(using=using, update_fields=["paused", "note", "next_nominal_at", "next_fire_at", "updated_at"])

    def trigger(self) -> WorkflowHandle | None:
        """Start a run now with the id ``f"{id}@manual-<8 hex>"``, even while paused, subject to the
        overlap policy. Returns its handle, or None when the policy skipped it."""
        from .client import WorkflowHandle

        using = _alias()
        workflow_id = manual_id(self.id)
        with transaction.atomic(using=using):
            row = _locked(self.id, using)
            definition = registry.workflow(row.workflow_type)
            now = db_now(using)
            outcome = fire(row, workflow_id, definition, now, using)
            if outcome in (STARTED, QUEUED):
                row.last_fired_at = now
                row.save(using=using, update_fields=["last_fired_at"])
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
        (cron, every, timezone, jitter) re-plans from now; the pause state is kept."""
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
                "args": codec.decode(row.args),
                "kwargs": codec.decode(row.kwargs),
                "overlap": row.overlap,
                "backfill": row.backfill,
                "jitter": timedelta(milliseconds=row.jitter_ms),
            }
            if "cron" in changes or "every" in changes:
                current["cron"] = current["every"] = None
            _save(row, _fields(self.id, {**current, **changes}), db_now(using), using)

    def delete(self) -> None:
        """Delete the schedule. Runs it started go on; a run waiting under overlap="queue" is cancelled."""
        using = _alias()
        with transaction.atomic(using=using):
            row = _locked(self.id, using)
            cancel_waiting(row.id, f'schedule "{row.id}" was deleted', using)
            row.delete(using=using)

    def describe(self) -> dict[str, Any]:
        """id, workflow_type, cron, every, timezone, args, kwargs, overlap, backfill, jitter, paused, note,
        next_fire_times (the next five, UTC; empty while paused), last_fired_at, missed_fire_count,
        running_ids (the active runs: running, pending or suspended)."""
        using = _alias()
        row = Schedule.objects.using(using).filter(pk=self.id).first()
        if row is None:
            raise ScheduleNotFoundError(f'No schedule "{self.id}" exists (never created, or deleted). Check the id.')
        timing = Timing.of(row)
        next_fire_times: list[datetime] = []
        if not row.paused and row.next_nominal_at is not None:
            now = db_now(using)
            next_fire_times = timing.fire_times(timing.upcoming(row.next_nominal_at, now))
        return {
            "id": row.id,
            "workflow_type": row.workflow_type,
            "cron": row.cron,
            "every": row.every,
            "timezone": row.timezone,
            "args": codec.decode(row.args),
            "kwargs": codec.decode(row.kwargs),
            "overlap": row.overlap,
            "backfill": row.backfill,
            "jitter": timedelta(milliseconds=row.jitter_ms) if row.jitter_ms else None,
            "paused": row.paused,
            "note": row.note,
            "next_fire_times": [moment.astimezone(UTC) for moment in next_fire_times],
            "last_fired_at": row.last_fired_at,
            "missed_fire_count": row.missed_fire_count,
            "running_ids": [run["id"] for run in active_runs(row.id, using)],
        }


def cancel_waiting(schedule_id: str, reason: str, using: str) -> None:
    """Cancel the schedule's queued runs that have not been released (its deletion)."""
    for run in active_runs(schedule_id, using):
        if run["waiting"]:
            with contextlib.suppress(WorkflowTerminalError):  # it ended meanwhile
                transitions.cancel(run["id"], reason, using=using)


__all__ = [
    "InvalidScheduleError",
    "ScheduleHandle",
    "ScheduleNotFoundError",
    "Timing",
    "get_schedule",
    "occurrence_id",
    "schedule",
    "validate_schedule",
]
