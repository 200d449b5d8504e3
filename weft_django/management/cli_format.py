"""Argument types and text formatting shared by ``manage.py weft``'s subcommands: durations and whole
numbers as argparse types, JSON for values the codec gives, times and claim expiries as the admin
shows them, and aligned tables."""

from __future__ import annotations

import argparse
import base64
import contextlib
import math
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.core.management.base import CommandError

from ..durations import MAX_DURATION_TEXT, DurationTooLong, InvalidDuration, to_nonnegative_timedelta

DURATION_FORMS = 'a number of seconds ("30", "0.5") or a number with a unit ("500ms", "30s", "5m", "2h", "7d")'


def duration_arg(value: str) -> timedelta:
    """A duration option (``--timeout``, ``--older-than``): a number of seconds or weft's forms with
    a unit, 0 or more and at most 100 years. The refusal names the forms a command line can give
    (weft's own message offers a timedelta too, which no command line passes)."""
    seconds: float | str = value
    with contextlib.suppress(ValueError):
        seconds = float(value)  # "30", "0.5", also "nan" and "inf" (refused below: inf as too long)
    try:
        if seconds == math.inf:
            raise DurationTooLong(value)
        duration = to_nonnegative_timedelta(seconds, "the duration")
    except DurationTooLong:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DURATION_TEXT} (got {value!r})") from None
    except InvalidDuration:
        raise argparse.ArgumentTypeError(f"must be a duration of 0 or more: {DURATION_FORMS} (got {value!r})") from None
    return duration


MAX_LIMIT = 2**63 - 1  # the largest LIMIT PostgreSQL and SQLite take (a 64-bit integer)


def positive_int_arg(value: str) -> int:
    """A ``--limit``: a whole number from 1 to MAX_LIMIT (a larger one is an error of the database)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_LIMIT} (got {value!r})")
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


def when(value: datetime | None, unreadable: str | None = None) -> str:
    """A time as the admin shows it; ``unreadable``: the stored text of a timestamp Python cannot
    represent (``store.moments``), shown marked instead."""
    from ..admin.formatting import when_text

    if unreadable is not None:
        return unreadable_text(unreadable)
    return when_text(value)  # never raises: a time out of the local zone's range is shown in UTC, marked


def unreadable_text(stored: str) -> str:
    """A damaged timestamp as the tools show it: "unreadable timestamp (infinity)"."""
    from ..store.moments import UNREADABLE

    return f"{UNREADABLE} ({stored})"


def unreadable_note(unreadable: dict[str, str]) -> str:
    """What ``weft describe`` says of a row with damaged timestamps (``describe()["unreadable"]``)."""
    held = ", ".join(f"{name} = {stored!r}" for name, stored in unreadable.items())
    return (
        f"{held}: a timestamp Python cannot represent (before year 1 or after 9999, or not a date), written "
        "by hand or by a bad migration; engines make the run stuck until the column is repaired (an UPDATE "
        "in SQL), and the tools show the rest of the row"
    )


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


def unreachable_database(alias: str) -> CommandError | None:
    """After an OperationalError: a CommandError saying the database ``alias`` does not answer, when
    a new connection to it fails too; None when it answers (the error was another one: keep it).

    Args:
        alias: the database alias the command uses.
    """
    from django.db import OperationalError, connections

    connection = connections[alias]
    try:
        connection.close()
        connection.ensure_connection()
    except OperationalError as exc:
        reason = " ".join(str(exc).split())  # psycopg's message spans lines
        return CommandError(
            f"Cannot reach the database {alias!r}: {reason}. Check DATABASES and that the server is up and "
            "accepts connections (`python manage.py weft doctor` checks the connection)."
        )
    return None
