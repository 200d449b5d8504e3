"""Checking the arguments of ``weft.schedule()`` into Schedule column values, and re-timing a row."""

from __future__ import annotations

import difflib
import math
import zoneinfo
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from croniter import CroniterError, croniter

from .. import codec
from ..durations import InvalidDuration, to_ms
from ..exceptions import CorruptPayloadError, InvalidScheduleError
from ..models import Schedule
from ..registry import resolve_workflow
from ..validation import MACHINE_ZONES, check_text
from .timing import (
    CRON_ALIASES,
    MAX_CRON_LENGTH,
    MAX_EVERY_SECONDS,
    MAX_JITTER_MS,
    MAX_SCHEDULE_ID_LENGTH,
    OVERLAP_POLICIES,
    Timing,
    unusable,
    zone_problem,
)


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
    problem = zone_problem(value)
    if problem is None:
        assert isinstance(value, str)
        return value
    names = [name for name in zoneinfo.available_timezones() if name not in MACHINE_ZONES]
    close = difflib.get_close_matches(str(value), names, n=1) if isinstance(value, str) else []
    hint = f' Did you mean "{close[0]}"?' if close else ""
    raise _invalid(
        f'timezone {value!r} is {problem}; use the IANA name of the zone you mean, such as "UTC" or '
        f'"Europe/Berlin", which every engine reads alike.{hint}'
    )


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


_ARGUMENT_KINDS: dict[str, type] = {"args": list, "kwargs": dict}


def stored_argument(row: Schedule, column: str) -> Any:
    """The row's ``column`` ("args" or "kwargs") decoded and checked: text edited by hand that does not
    decode (or is not a list / a dict) raises UnusableScheduleError naming it, not the codec's error."""
    kind = _ARGUMENT_KINDS[column]
    try:
        value = codec.decode(getattr(row, column))
    except CorruptPayloadError as exc:
        raise unusable(row.id, column, f"does not decode ({exc})") from None
    if not isinstance(value, kind):
        raise unusable(row.id, column, f"holds a {type(value).__name__}, not a {kind.__name__}")
    return value


def stored_arguments(row: Schedule) -> tuple[list[Any], dict[str, Any]]:
    """The row's args and kwargs, each as ``stored_argument`` reads it."""
    return stored_argument(row, "args"), stored_argument(row, "kwargs")


def stored_input(row: Schedule) -> str:
    """The input of a run the stored row starts (``run_input`` of its checked args and kwargs)."""
    args, kwargs = stored_arguments(row)
    return codec.encode_payload({"args": args, "kwargs": kwargs}, path="input")


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
