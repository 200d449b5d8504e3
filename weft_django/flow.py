"""Flow-control values (a leaf): rates such as ``"100/m"``, a queue's configuration (``WEFT["QUEUES"]``)
and an activity's limits. Parsing only; admission lives in ``store/queues.py`` and ``store/limits.py``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .durations import MAX_DURATION
from .validation import is_storable

RATE_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*(s|sec|m|min|h|d)\s*$")
RATE_HINT = 'Write a rate as "<count>/<period>": "10/s", "100/m", "1000/h", "5/30s" (count and period positive).'
QUEUE_KEYS = ("concurrency", "per_engine", "rate", "priorities")
MAX_PRIORITY = 2**31 - 1
# The longest rate window, as every duration weft accepts: admission and dispatch count from
# ``now - period``, which must stay a date (a longer period failed every engine pass with OverflowError).
MAX_RATE_PERIOD = MAX_DURATION


class FlowValueError(ValueError):
    """A rate or a limit that cannot be used (the message says what was expected)."""


@dataclass(frozen=True)
class Rate:
    """At most ``limit`` admissions in any window of ``period``."""

    limit: int
    period: timedelta

    def __str__(self) -> str:
        return f"{self.limit}/{self.period.total_seconds():g}s"


def parse_rate(value: Any, name: str = "rate") -> Rate:
    """``"100/m"`` (also ``"5/30s"``, ``(limit, seconds)``) as a Rate.

    Args:
        value: the rate; ``name``: what it is called in the error message.

    Raises:
        FlowValueError: not a rate, or a count or period that is not positive.
    """
    if isinstance(value, tuple | list) and len(value) == 2:
        limit, seconds = value
        number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
        if _whole(limit) and limit > 0 and number and seconds > 0:
            return Rate(int(limit), _period(float(seconds), name, value))
        raise FlowValueError(f"{name} must be a positive (count, seconds) pair (got {value!r}). {RATE_HINT}")
    if not isinstance(value, str):
        raise FlowValueError(f"{name} must be a rate string (got {value!r}). {RATE_HINT}")
    found = _RATE.match(value)
    if found is None:
        raise FlowValueError(f"{name}: cannot parse the rate {value!r}. {RATE_HINT}")
    count, multiple, unit = int(found.group(1)), found.group(2), found.group(3)
    seconds = (float(multiple) if multiple else 1.0) * RATE_UNITS[unit]
    if count <= 0 or seconds <= 0:
        raise FlowValueError(f"{name}: the rate {value!r} needs a positive count and period. {RATE_HINT}")
    return Rate(count, _period(seconds, name, value))


def _period(seconds: float, name: str, value: Any) -> timedelta:
    """A rate's window of ``seconds`` (> 0): at least a microsecond (shorter rounds to a zero window,
    which never refuses anything) and at most MAX_RATE_PERIOD. Raises FlowValueError otherwise."""
    if seconds <= MAX_RATE_PERIOD.total_seconds():
        period = timedelta(seconds=seconds)
        if period > timedelta(0):
            return period
    raise FlowValueError(
        f"{name}: the rate {value!r} needs a period from 1 microsecond to {MAX_RATE_PERIOD.days} days. {RATE_HINT}"
    )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_limit(value: Any, name: str) -> int:
    """A concurrency limit: a whole number >= 1.

    Raises:
        FlowValueError: anything else (zero, negative, not a whole number).
    """
    if not _whole(value) or value <= 0:
        raise FlowValueError(f"{name} must be a whole number >= 1 (got {value!r}).")
    return int(value)


@dataclass(frozen=True)
class QueueConfig:
    """One queue of ``WEFT["QUEUES"]``.

    Attributes:
        name: the queue's name.
        concurrency: at most this many of its workflows admitted and not ended, across all engines (None: no limit).
        per_engine: at most this many held by one engine (None: no limit).
        rate: at most ``rate.limit`` admissions per ``rate.period`` (None: no limit).
        priorities: whether starts may give a priority (lower runs first); else FIFO only.
    """

    name: str
    concurrency: int | None = None
    per_engine: int | None = None
    rate: Rate | None = None
    priorities: bool = False


def parse_queue(name: Any, raw: Any) -> tuple[QueueConfig | None, list[tuple[str, str]]]:
    """One ``WEFT["QUEUES"]`` entry: (its config, or None when broken; problems as (check id, message)).

    Check ids: E029 a bad name or entry, E030 a limit that is not a whole number >= 1, E031 a rate
    that cannot be parsed, E032 an unknown key or a ``priorities`` that is not a bool.
    """
    problems: list[tuple[str, str]] = []
    if not isinstance(name, str) or not name.strip() or len(name) > 255 or "," in name or not is_storable(name):
        return None, [
            (
                "E029",
                f"QUEUES: a queue name must be a non-empty string of at most 255 characters "
                f"without commas, NUL or unpaired surrogates (got {name!r}).",
            )
        ]
    if not isinstance(raw, Mapping):
        return None, [("E029", f'QUEUES["{name}"] must be a dict of {", ".join(QUEUE_KEYS)} (got {raw!r}).')]
    for key in raw:
        if key not in QUEUE_KEYS:
            problems.append(("E032", f'QUEUES["{name}"] has an unknown key {key!r}; keys: {", ".join(QUEUE_KEYS)}.'))
    limits: dict[str, int | None] = {}
    for key in ("concurrency", "per_engine"):
        value = raw.get(key)
        limits[key] = None
        if value is not None:
            try:
                limits[key] = positive_limit(value, f'QUEUES["{name}"]["{key}"]')
            except FlowValueError as exc:
                problems.append(("E030", str(exc)))
    rate = None
    if raw.get("rate") is not None:
        try:
            rate = parse_rate(raw["rate"], f'QUEUES["{name}"]["rate"]')
        except FlowValueError as exc:
            problems.append(("E031", str(exc)))
    priorities = raw.get("priorities", False)
    if not isinstance(priorities, bool):
        problems.append(("E032", f'QUEUES["{name}"]["priorities"] must be True or False (got {priorities!r}).'))
    if problems:
        return None, problems
    return QueueConfig(name, limits["concurrency"], limits["per_engine"], rate, bool(priorities)), []


@dataclass(frozen=True)
class ActivityLimits:
    """An activity's limits across every engine (``@weft.activity(concurrency=, rate=, concurrency_key=)``).

    Attributes:
        concurrency: at most this many attempts running at once (None: no limit).
        rate: at most ``rate.limit`` attempts started per ``rate.period`` (None: no limit).
        key: a callable of the activity's arguments giving a key (str, or None for no key), or None:
            at most ``per_key`` attempts run at once for one key.
        per_key: how many attempts of one key may run at once (1: one customer's charges in turn).
    """

    concurrency: int | None = None
    rate: Rate | None = None
    key: Any = None
    per_key: int = 1

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None or self.key is not None


NO_LIMITS = ActivityLimits()

__all__ = [
    "MAX_PRIORITY",
    "MAX_RATE_PERIOD",
    "NO_LIMITS",
    "QUEUE_KEYS",
    "RATE_HINT",
    "ActivityLimits",
    "FlowValueError",
    "QueueConfig",
    "Rate",
    "parse_queue",
    "parse_rate",
    "positive_limit",
]
