"""Argument types and text formatting shared by ``manage.py weft``'s subcommands: durations and whole
numbers as argparse types, JSON for values the codec gives, times and claim expiries as the admin
shows them, and aligned tables."""

from __future__ import annotations

import argparse
import base64
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from ..durations import InvalidDuration, to_nonnegative_timedelta


def duration_arg(value: str) -> timedelta:
    try:
        return to_nonnegative_timedelta(value, "the duration")
    except InvalidDuration as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int_arg(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1 (got {value!r})")
    return number


def json_default(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, UUID | Decimal):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return str(value)


def when(value: datetime | None) -> str:
    from ..admin.formatting import when_text

    return when_text(value)  # never raises: a time out of the local zone's range is shown in UTC, marked


def claim_expiry(expires_at: datetime | None, now: datetime, *, lapsed: bool) -> str | None:
    """The claim's expiry, relative to ``now``, marked when the claim lapsed (``admin.health``'s rule:
    expired, or its holder silent for longer than the TTL)."""
    from ..admin.formatting import relative

    if expires_at is None:
        return None
    return relative(expires_at, now) + (" (lapsed)" if lapsed else "")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns aligned to their widest cell; None shows as "-"."""
    cells = [[("-" if cell is None else str(cell)) for cell in row] for row in rows]
    widths = [max([len(header), *(len(row[i]) for row in cells)]) for i, header in enumerate(headers)]
    lines = ["  ".join(header.ljust(widths[i]) for i, header in enumerate(headers)).rstrip()]
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in cells]
    return "\n".join(lines)
