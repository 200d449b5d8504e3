"""The options of ``manage.py weft replay`` (management/commands/weft_replay.py), here so that the
``weft`` CLI can offer the subcommand without importing the engine's driver."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from ..durations import InvalidDuration, to_nonnegative_timedelta
from ..exceptions import InvalidArgumentError
from ..validation import check_text


def since(value: str) -> datetime | timedelta:
    """``--since``: an ISO 8601 time (with its zone) or a duration back from now ("7d", "12h")."""
    try:
        return to_nonnegative_timedelta(value, "--since")
    except InvalidDuration:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'--since takes a duration back from now ("7d", "12h") or an ISO 8601 time with its zone (got {value!r})'
        ) from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"--since {value!r} has no time zone; add one, e.g. +00:00")
    try:
        moment.astimezone(UTC)  # the database compares it in UTC
    except OverflowError:
        raise argparse.ArgumentTypeError(f"--since {value!r} is outside years 1-9999 in UTC") from None
    return moment


def workflow_type(value: str) -> str:
    """``--type``: a workflow type's name (text the database can compare: no NUL, no lone surrogate)."""
    try:
        return check_text(value, "--type", max_length=255)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def limit(value: str) -> int:
    """``--limit``: a whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1 (got {value!r})")
    return number


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``weft replay``: filters, a limit, or exported files instead of the store."""
    parser.add_argument(
        "--type", dest="types", action="append", type=workflow_type, help="Only this workflow type; repeatable."
    )
    parser.add_argument("--since", type=since, help='Only runs created since: "7d", "12h" or an ISO 8601 time.')
    parser.add_argument("--limit", dest="max_runs", type=limit, help="Replay at most this many runs.")
    parser.add_argument("--open", dest="open_only", action="store_true", help="Only runs that have not ended.")
    parser.add_argument("--file", dest="files", action="append", help="Replay this exported history file instead.")
