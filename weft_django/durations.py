"""Durations in every accepted form: timedelta, int/float seconds, or "500ms" "30s" "5m" "2h" "7d".

Every duration weft accepts is bounded by ``MAX_DURATION`` (100 years). A longer one is not a
plan but a typo or an attack: added to "now" it leaves the range of a Python datetime
(year 9999) and used to crash the engine that read it (``OverflowError: date value out of
range``). ``to_ms`` and everything built on it raise ``DurationTooLong`` instead, naming the
bound, at the point the value enters (the call to ``ctx.sleep``, ``RetryPolicy(...)``,
``start(..., start_after=...)``, a setting). Code that adds a duration to a time of its own
uses ``check_duration`` on the result of its own arithmetic.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")

Duration = timedelta | int | float | str

#: The longest duration weft accepts anywhere (sleeps, timeouts, backoffs, start_after, settings).
MAX_DURATION = timedelta(days=36_500)
MAX_DURATION_MS = int(MAX_DURATION.total_seconds()) * 1000
MAX_DURATION_TEXT = "100 years (36500 days)"


class InvalidDuration(ValueError):
    """The value is not a duration. The message names where it came from and the accepted forms."""


class DurationTooLong(InvalidDuration):
    """The value is a duration longer than ``MAX_DURATION`` (either sign). The message names the bound."""


def to_ms(value: object, name: str = "duration") -> int:
    """Return ``value`` as whole milliseconds, or raise InvalidDuration naming ``name``.

    Negative values are returned as they are: whether zero or a negative duration is
    acceptable is the caller's rule (weft's ownership checks report them with their own
    sentences). A value beyond ``MAX_DURATION`` either way raises ``DurationTooLong``.
    """
    if isinstance(value, bool):
        raise InvalidDuration(_message(name, value))
    if isinstance(value, timedelta):
        return check_ms(_ms_of_timedelta(value), name, value)
    if isinstance(value, int):
        if abs(value) > MAX_DURATION_MS // 1000:
            raise DurationTooLong(too_long_message(name, value))
        return value * 1000
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidDuration(_message(name, value))
        if abs(value) > MAX_DURATION_MS / 1000:
            raise DurationTooLong(too_long_message(name, value))
        return check_ms(round(value * 1000), name, value)
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match:
            number = float(match.group(1))
            if not math.isfinite(number) or number * _UNITS_MS[match.group(2)] > MAX_DURATION_MS:
                raise DurationTooLong(too_long_message(name, value))
            return check_ms(round(number * _UNITS_MS[match.group(2)]), name, value)
    raise InvalidDuration(_message(name, value))


def check_ms(ms: int, name: str = "duration", shown: object = None) -> int:
    """Return ``ms`` if it is within ``MAX_DURATION`` either way, else raise ``DurationTooLong``."""
    if abs(ms) > MAX_DURATION_MS:
        raise DurationTooLong(too_long_message(name, ms if shown is None else shown))
    return ms


def check_duration(value: timedelta, name: str = "duration") -> timedelta:
    """Return the timedelta ``value`` if it is within ``MAX_DURATION`` either way, else raise."""
    if abs(value) > MAX_DURATION:
        raise DurationTooLong(too_long_message(name, value))
    return value


def to_timedelta(value: object, name: str = "duration") -> timedelta:
    return timedelta(milliseconds=to_ms(value, name))


def to_nonnegative_timedelta(value: object, name: str = "duration") -> timedelta:
    """A duration that must not be negative (timeouts and sleeps given by users)."""
    ms = to_ms(value, name)
    if ms < 0:
        raise InvalidDuration(f"{name} must not be negative (got {value!r}).")
    return timedelta(milliseconds=ms)


def too_long_message(name: str, value: object) -> str:
    return (
        f"{name} must be at most {MAX_DURATION_TEXT}, weft_django.durations.MAX_DURATION "
        f"(got {value!r}). The bound keeps every deadline weft computes from it a valid date; "
        "pass a shorter duration."
    )


def _ms_of_timedelta(value: timedelta) -> int:
    # Integer arithmetic: total_seconds() is a float and loses whole milliseconds near timedelta.max.
    return (value.days * 86_400 + value.seconds) * 1000 + round(value.microseconds / 1000)


def _message(name: str, value: object) -> str:
    return (
        f"{name} must be a duration: a timedelta, a number of seconds, or a string such as "
        f'"500ms", "30s", "5m", "2h" or "7d" (got {value!r}).'
    )
