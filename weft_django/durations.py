"""Durations in every accepted form: timedelta, int/float seconds, or "500ms" "30s" "5m" "2h" "7d"."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")

Duration = timedelta | int | float | str


class InvalidDuration(ValueError):
    """The value is not a duration. The message names where it came from and the accepted forms."""


def to_ms(value: object, name: str = "duration") -> int:
    """Return ``value`` as whole milliseconds, or raise InvalidDuration naming ``name``.

    Negative values are returned as they are: whether zero or a negative duration is
    acceptable is the caller's rule (weft's ownership checks report them with their own
    sentences).
    """
    if isinstance(value, bool):
        raise InvalidDuration(_message(name, value))
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise InvalidDuration(_message(name, value))
        return round(value * 1000)
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match:
            return round(float(match.group(1)) * _UNITS_MS[match.group(2)])
    raise InvalidDuration(_message(name, value))


def to_timedelta(value: object, name: str = "duration") -> timedelta:
    return timedelta(milliseconds=to_ms(value, name))


def to_nonnegative_timedelta(value: object, name: str = "duration") -> timedelta:
    """A duration that must not be negative (timeouts and sleeps given by users)."""
    ms = to_ms(value, name)
    if ms < 0:
        raise InvalidDuration(f"{name} must not be negative (got {value!r}).")
    return timedelta(milliseconds=ms)


def _message(name: str, value: object) -> str:
    return (
        f"{name} must be a duration: a timedelta, a number of seconds, or a string such as "
        f'"500ms", "30s", "5m", "2h" or "7d" (got {value!r}).'
    )
