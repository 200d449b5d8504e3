"""A run's history as JSON: what ``manage.py weft export ID`` writes and
``weft_django.testing.replay`` and the replay check read. Payload columns stay codec text (what
replay feeds the code must equal what the live run saw), times are ISO 8601.

Format ``weft-history/1``::

    {"format": "weft-history/1", "workflow_id", "run_id", "workflow_type", "version", "status",
     "input", "result", "error", "started_at", "created_at",
     "steps": [{"seq", "kind", "name", "status", "result", "error", "attempts", "started_at",
                "completed_at"}, ...],
     "applied": [{"seq", "n", "name", "payload", "result", "error", "update_id"}, ...],
     "timer_seqs": [seq, ...], "timer_kinds": {"<seq>": kind, ...}, "fork_origin": {...} | null}

``timer_kinds`` (what armed each timer: a sleep, a signal or wait_until timeout, an activity retry) is
optional: a history exported without it replays without checking the operation at a timer's position.
``fork_origin`` (a run ``weft.fork`` made: its source's seeds and start time below the fork point,
``deterministic.Lineage``) is optional too: without it a fork replays with its own values.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from .deterministic import Lineage
from .exceptions import CorruptPayloadError, InvalidArgumentError
from .status import StepStatus, WorkflowStatus
from .store.histories import AppliedRecord, StepRecord
from .store.replay import StoredHistory

FORMAT = "weft-history/1"


def to_json(history: StoredHistory) -> dict[str, Any]:
    """The JSON object of a stored history (``weft export``).

    Args:
        history: the run, as store/replay.py reads it.
    """
    return {
        "format": FORMAT,
        "workflow_id": history.workflow_id,
        "run_id": history.run_id,
        "workflow_type": history.workflow_type,
        "version": history.version,
        "status": history.status,
        "input": history.input,
        "result": history.result,
        "error": history.error,
        "started_at": _time(history.started_at),
        "created_at": _time(history.created_at),
        "steps": [
            {
                "seq": step.seq,
                "kind": step.kind,
                "name": step.name,
                "status": step.status,
                "result": step.result,
                "error": step.error,
                "attempts": step.attempts,
                "started_at": _time(step.started_at),
                "completed_at": _time(step.completed_at),
            }
            for step in sorted(history.steps.values(), key=lambda step: step.seq)
        ],
        "applied": [
            {
                "seq": record.seq,
                "n": record.n,
                "name": record.name,
                "payload": record.payload,
                "result": record.result,
                "error": record.error,
                "update_id": record.update_id,
            }
            for record in history.applied
        ],
        "timer_seqs": sorted(history.timer_seqs),
        "timer_kinds": {str(seq): kind for seq, kind in sorted(history.timer_kinds.items())},
        "fork_origin": history.fork_origin,
    }


def load(source: StoredHistory | dict[str, Any] | str | Path) -> StoredHistory:
    """A history from what ``weft export`` wrote: the object, its JSON text, or a file's path.

    Args:
        source: a StoredHistory (returned as is), a dict, JSON text, or a path to a JSON file (UTF-8).

    Raises:
        InvalidArgumentError: the file is missing or unreadable (not UTF-8: a file cut inside a
            character), not JSON, or not a ``weft-history/1`` object; the message names the field that
            is wrong (a hand edit: a missing key, a value of another type, a time without a zone, a
            step seq twice, NaN or Infinity).
    """
    if isinstance(source, StoredHistory):
        return source
    data: Any = source
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        try:
            data = Path(source).read_bytes().decode("utf-8")  # what export writes, whatever the locale
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path; UnicodeDecodeError: not UTF-8
            raise InvalidArgumentError(f"Cannot read the history file {str(source)[:200]!r}: {exc}.") from None
    if isinstance(data, str):
        try:
            data = json.loads(data, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise InvalidArgumentError(f"The history is not JSON ({exc}); pass what `weft export` wrote.") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidArgumentError(
            f'A history is a JSON object with "format": "{FORMAT}", as `manage.py weft export ID` writes it.'
        )
    try:
        return _history(data)
    except _Bad as exc:
        raise InvalidArgumentError(f"The history is not a valid {FORMAT} object: {exc}.") from None


class _Bad(Exception):
    """A field of the history that is missing or not what export writes (the message names it)."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _history(data: dict[str, Any]) -> StoredHistory:
    run_id = _text(data, "run_id", "")
    steps: dict[int, StepRecord] = {}
    for index, step in enumerate(_list(data, "steps", "")):
        where = f"steps[{index}]."
        row = _object(step, where[:-1])
        seq = _whole(row, "seq", where)
        if seq in steps:
            raise _Bad(f"{where}seq: step {seq} appears twice")
        steps[seq] = StepRecord(
            seq,
            _text(row, "kind", where),
            _text(row, "name", where, optional=True) or "",
            _status(row, "status", where, StepStatus.values),
            _text(row, "result", where, optional=True),
            row.get("error"),
            _whole(row, "attempts", where, optional=True) or 0,
            _when(row, "started_at", where),
            _when(row, "completed_at", where),
        )
    applied = []
    for index, record in enumerate(_list(data, "applied", "")):
        where = f"applied[{index}]."
        row = _object(record, where[:-1])
        applied.append(
            AppliedRecord(
                _whole(row, "seq", where),
                _whole(row, "n", where),
                _text(row, "name", where),
                _text(row, "payload", where),
                _text(row, "result", where, optional=True),
                row.get("error"),
                _text(row, "update_id", where, optional=True),
            )
        )
    timer_seqs = {_item_whole(seq, f"timer_seqs[{i}]") for i, seq in enumerate(_list(data, "timer_seqs", ""))}
    kinds = data.get("timer_kinds") or {}
    if not isinstance(kinds, dict) or not all(isinstance(kind, str) for kind in kinds.values()):
        raise _Bad(f"timer_kinds: an object of seq -> kind is expected, not {_shown(kinds)}")
    try:
        timer_kinds = {int(seq): kind for seq, kind in kinds.items()}
    except ValueError:
        raise _Bad(f"timer_kinds: its keys are step seqs, not {_shown(list(kinds))}") from None
    try:
        Lineage.from_json(data.get("fork_origin"), run_id)
    except CorruptPayloadError as exc:
        raise _Bad(f"fork_origin: {exc}") from None
    return StoredHistory(
        workflow_id=_text(data, "workflow_id", ""),
        run_id=run_id,
        workflow_type=_text(data, "workflow_type", ""),
        version=_text(data, "version", "", optional=True) or "1",
        status=_status(data, "status", "", WorkflowStatus.values),
        input=_text(data, "input", ""),
        result=_text(data, "result", "", optional=True),
        error=data.get("error"),
        started_at=_when(data, "started_at", ""),
        created_at=_when(data, "created_at", ""),
        steps=steps,
        applied=applied,
        timer_seqs=timer_seqs,
        timer_kinds=timer_kinds,
        fork_origin=data.get("fork_origin"),
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{where}: an object is expected, not {_shown(value)}")
    return value


def _list(data: dict[str, Any], key: str, where: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Bad(f"{where}{key}: a list is expected, not {_shown(value)}")
    return value


def _text(data: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    if key not in data and not optional:
        raise _Bad(f"{where}{key} is missing")
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _Bad(
            f"{where}{key}: text is expected (payloads are codec text, as export writes them), not {_shown(value)}"
        )
    return value


def _status(data: dict[str, Any], key: str, where: str, allowed: list[str]) -> str:
    value = _text(data, key, where)
    if value not in allowed:
        raise _Bad(f"{where}{key}: {_shown(value)} is not one of {', '.join(allowed)}")
    return str(value)


def _whole(data: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    if key not in data and not optional:
        raise _Bad(f"{where}{key} is missing")
    value = data.get(key)
    if value is None and optional:
        return None
    return _item_whole(value, f"{where}{key}")


def _item_whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Bad(f"{where}: a whole number >= 0 is expected, not {_shown(value)}")
    return value


def _when(data: dict[str, Any], key: str, where: str) -> datetime | None:
    value = data.get(key)
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError("not text")
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _Bad(f"{where}{key}: an ISO 8601 time is expected, not {_shown(value)}") from None
    if parsed.utcoffset() is None:
        raise _Bad(f"{where}{key}: {_shown(value)} has no UTC offset (export writes aware times)")
    return parsed


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
