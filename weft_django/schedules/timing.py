"""Schedules' time arithmetic: cron in an IANA time zone, intervals, deterministic jitter.

Every occurrence has a nominal UTC time and the run id ``f"{schedule_id}@{nominal:%Y-%m-%dT%H:%M:%SZ}"``;
jitter delays when it fires, never its id.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

from croniter import CroniterBadDateError, CroniterError, croniter

from ..exceptions import UnusableScheduleError
from ..models import Schedule
from ..status import OverlapPolicy
from ..validation import MACHINE_ZONES, portable_zone

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
# croniter's own bound (max_years_between_matches): a cron that gives no instant for this long never fires.
_MAX_YEARS_WITHOUT_A_FIRE = timedelta(days=366 * 50)
_UNSET: Any = object()

STARTED, QUEUED, SKIPPED, EXISTS = "started", "queued", "skipped", "exists"
T = TypeVar("T")
P = ParamSpec("P")
# How to repair each column of a stored row that cannot be used (UnusableScheduleError's message).
_REPAIRS = {
    "cron": "update(cron=...) or update(every=...)",
    "every": "update(every=...) or update(cron=...)",
    "timezone": "update(timezone=...)",
    "jitter_ms": "update(jitter=...)",
    "args": "update(args=..., kwargs=...)",
    "kwargs": "update(args=..., kwargs=...)",
    "next_nominal_at": "a change of its timing in update() (which plans again from now)",
    "next_fire_at": "pause() then resume() (which plans again from now)",
}


def unusable(schedule_id: str, column: str, problem: str) -> UnusableScheduleError:
    """The error for a stored schedule row whose ``column`` cannot be used: names the schedule, the
    column and the repair (the handle's ``update()``), or deleting it."""
    repair = f'weft.get_schedule("{schedule_id}").{_REPAIRS.get(column, "update()")}'
    return UnusableScheduleError(
        f'Schedule "{schedule_id}" cannot be used as stored: its {column} {problem}. Repair it with {repair} '
        f"(or the admin's form), or delete it.",
        schedule_id,
        column,
    )


def check_timing_readable(row: Any) -> None:
    """UnusableScheduleError when the row's next fire time or next nominal time holds a time Python
    cannot represent (a hand edit: past year 9999, ``'infinity'``; ``store.schedules.lock_schedule``
    reads it as None and names it in ``row.unreadable``). resume(), or update() of the timing, plans
    again from now (and so does pause() then resume())."""
    for column in ("next_nominal_at", "next_fire_at"):
        if column in getattr(row, "unreadable", ()):
            raise unusable(row.id, column, "holds a time Python cannot represent (past year 9999, or before year 1)")


def zone_problem(value: object) -> str | None:
    """Why ``value`` cannot be a schedule's time zone, or None: it must be an IANA name
    (``validation.portable_zone``), so that every engine reads the cron in the same zone. A key whose
    zone the machine decides ("localtime": the machine's own zone) fired at other times on an engine
    set otherwise, or (the "posix/" and "right/" copies) could not fire where they are missing."""
    if not isinstance(value, str):
        return "not an IANA time zone name"
    if 0 < len(value) <= MAX_TIMEZONE_LENGTH and portable_zone(value):
        return None
    if value in MACHINE_ZONES or value.split("/")[0] in ("posix", "right"):
        return (
            "not an IANA time zone name but one this machine's time zone files decide (another engine's "
            "machine may read it as another zone, or not at all)"
        )
    return "not an IANA time zone name"


def occurrence_id(schedule_id: str, nominal: datetime) -> str:
    """The run id of the occurrence at ``nominal``: two engines firing it start one run."""
    return f"{schedule_id}@{nominal.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def manual_id(schedule_id: str) -> str:
    return f"{schedule_id}@manual-{uuid.uuid4().hex[:8]}"


def _ceil_second(moment: datetime) -> datetime:
    whole = moment.replace(microsecond=0)
    return whole if whole == moment else whole + timedelta(seconds=1)


def _checked(method: Callable[Concatenate[Timing, P], T]) -> Callable[Concatenate[Timing, P], T]:
    """Run a Timing method under ``Timing._computing`` (the one place the arithmetic's errors convert)."""

    @functools.wraps(method)
    def checked(self: Timing, /, *args: P.args, **kwargs: P.kwargs) -> T:
        with self._computing():
            return method(self, *args, **kwargs)

    return checked


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
        """The timing of a stored row, checked: a row edited by hand whose cron, interval, time zone or
        jitter cannot be used raises UnusableScheduleError naming the column, not the library's error."""
        timing = cls(row.id, row.cron, row.every, row.timezone, row.jitter_ms)
        fault = timing._fault()
        if fault is not None:
            raise unusable(row.id, *fault)
        return timing

    def _fault(self) -> tuple[str, str] | None:
        """(column, problem) of the first column the arithmetic cannot use, or None."""
        if (self.cron is None) == (self.every is None):
            return "cron", "and every are invalid together: both set or both empty (exactly one of them must be)"
        if self.every is not None and (
            isinstance(self.every, bool) or not isinstance(self.every, int) or not 1 <= self.every <= MAX_EVERY_SECONDS
        ):
            return "every", f"{self.every!r} is invalid: not a whole number of seconds from 1 to {MAX_EVERY_SECONDS}"
        if not isinstance(self.jitter_ms, int) or not 0 <= self.jitter_ms <= MAX_JITTER_MS:
            return "jitter_ms", f"{self.jitter_ms!r} is invalid: not between 0 and {MAX_JITTER_MS}"
        problem = zone_problem(self.timezone)
        if problem is not None:
            return "timezone", f"{self.timezone!r} is invalid: {problem}"
        if self.cron is not None:
            try:
                if len(self.expression.split()) != 5:
                    raise ValueError("it does not have five fields")
                croniter(self.expression, datetime(2000, 1, 1), hash_id=self.schedule_id)
            except (CroniterError, ValueError, KeyError, TypeError, AttributeError) as exc:
                return "cron", f"{self.cron!r} is an invalid cron expression ({exc})"
        return None

    @contextlib.contextmanager
    def _computing(self) -> Iterator[None]:
        """Where the arithmetic on a stored row fails (a next occurrence a step from year 9999, a cron
        that never matches): UnusableScheduleError naming the column instead of the library's error."""
        try:
            yield
        except OverflowError:
            raise unusable(
                self.schedule_id, "next_nominal_at", "is too close to year 9999 to compute the occurrences after it"
            ) from None
        except CroniterError as exc:
            raise unusable(self.schedule_id, "cron", f"{self.cron!r} never matches a date ({exc})") from None

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
        """Deterministic in [0, min(jitter, the gap to the next occurrence)): every engine computes the
        same delay for an occurrence, and an occurrence fires before the next one's nominal time, so
        fire times stay in order (Temporal's rule; a jitter as long as the period used to put a later
        occurrence before an earlier one, which the pass then counted as missed)."""
        if not self.jitter_ms:
            return timedelta(0)
        window = min(self.jitter_ms, self._gap_ms(nominal))
        if window <= 0:
            return timedelta(0)
        digest = hashlib.sha256(occurrence_id(self.schedule_id, nominal).encode()).digest()
        return timedelta(milliseconds=int.from_bytes(digest[:8], "big") % window)

    def _gap_ms(self, nominal: datetime) -> int:
        """Whole milliseconds from the occurrence at ``nominal`` to the next one."""
        if self.every is not None:
            return self.every * 1000
        gap = next(self._cron_after(nominal)) - nominal
        return gap // timedelta(milliseconds=1)

    @_checked
    def fire_at(self, nominal: datetime) -> datetime:
        return nominal + self.jitter(nominal)

    @_checked
    def first_after(self, now: datetime) -> datetime:
        """The nominal time of the first occurrence of a schedule created (or re-timed) at ``now``:
        ``every`` fires one period later (from the next whole second), ``cron`` at its next match."""
        if self.every is not None:
            return _ceil_second(now) + timedelta(seconds=self.every)
        return next(self._cron_after(now))

    def following(self, nominal: datetime) -> Iterator[datetime]:
        """The nominal times after the occurrence at ``nominal``, in order."""
        with self._computing():
            yield from self._following(nominal)

    def _following(self, nominal: datetime) -> Iterator[datetime]:
        if self.every is None:
            yield from self._cron_after(nominal)
            return
        period = timedelta(seconds=self.every)
        while True:
            nominal += period
            yield nominal

    @_checked
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

    @_checked
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
        last, found = after, wall  # found: the latest candidate that exists on the zone's wall clock
        while True:
            try:
                candidate = candidates.get_next(datetime)
            except CroniterError:
                raise
            except ValueError as exc:  # past year 9999 croniter (dateutil) says "year 10000 is out of range"
                raise OverflowError(str(exc)) from None
            instants = _instants(candidate, zone, fixed)
            if instants:
                found = candidate
            elif candidate - found > _MAX_YEARS_WITHOUT_A_FIRE:  # every match in a daylight-saving gap
                raise CroniterBadDateError(
                    f"every wall-clock time it matches in {self.timezone} for {_MAX_YEARS_WITHOUT_A_FIRE.days // 366} "
                    f"years falls in a daylight-saving gap, where a wildcard job does not fire"
                )
            for instant in instants:
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
