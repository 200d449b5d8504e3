"""What the client's modules share: the database alias, argument checks and the input's encoding."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .. import codec, validation
from ..conf import database_alias
from ..exceptions import InvalidArgumentError, PayloadNotSerializableError
from ..status import WorkflowStatus
from ..validation import validate_key, validate_name, validate_signal_name

# The summary fields of describe(), in order (manage.py weft prints them in this order too).
SUMMARY_FIELDS = (
    "id",
    "status",
    "workflow_type",
    "version",
    "run_id",
    "owner_engine",
    "epoch",
    "claim_expires_at",
    "created_at",
    "started_at",
    "finished_at",
    "current_step",
    "pending_timers",
)

ON_CONFLICT = ("error", "use_existing", "start_new")
_UNSET: Any = object()


# Every text, duration and moment is checked by weft_django.validation (NUL, lone surrogates, length,
# MAX_DURATION); the names below are kept for the modules that import them from here.

_validate_key = validate_key
_validate_name = validate_name
_validate_signal_name = validate_signal_name
_duration = validation.duration


def _alias() -> str:
    return database_alias()


def _encode_input(args: Any, kwargs: Any) -> str:
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise InvalidArgumentError(
            f"args must be a list or tuple of positional arguments (got {type(args).__name__}: "
            f"{args!r:.60}); for a single argument pass args=[value]."
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(key, str) for key in kwargs):
        raise InvalidArgumentError(f"kwargs must be a dict with str keys (got {kwargs!r:.60}).")
    value = {"args": list(args), "kwargs": dict(kwargs)}
    try:
        return codec.encode_payload(value, path="input")
    except PayloadNotSerializableError:
        # Name the bad part from the caller's point of view: args[1]['items'][3], not input['args'][1]...
        codec.encode(value["args"], path="args")
        codec.encode(value["kwargs"], path="kwargs")
        raise


def _start_time(start_after: Any, start_at: Any) -> timedelta | datetime | None:
    if start_after is not None and start_at is not None:
        raise InvalidArgumentError(
            "start_after and start_at are mutually exclusive: pass a delay (start_after) or a moment "
            "(start_at), not both."
        )
    if start_after is not None:
        return _duration(start_after, "start_after")
    if start_at is not None:
        return validation.start_moment(start_at)
    return None


def _status(stored: str) -> WorkflowStatus | str:
    try:
        return WorkflowStatus(stored)
    except ValueError:
        return stored  # an odd row: shown as stored (the admin and `weft describe` mark it)


def _wait_seconds(timeout: Any) -> float:
    if timeout is None:
        raise InvalidArgumentError(
            'timeout must be a positive duration such as "5s" (got None): query() and update() always wait '
            "a bounded time."
        )
    return _duration(timeout, "timeout", positive=True).total_seconds()
