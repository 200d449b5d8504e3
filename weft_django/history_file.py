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
from .exceptions import InvalidArgumentError
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
        source: a StoredHistory (returned as is), a dict, JSON text, or a path to a JSON file.

    Raises:
        InvalidArgumentError: the file is missing, not JSON, or not a ``weft-history/1`` object.
    """
    if isinstance(source, StoredHistory):
        return source
    data: Any = source
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        try:
            data = Path(source).read_text()
        except OSError as exc:
            raise InvalidArgumentError(f"Cannot read the history file {str(source)!r}: {exc}.") from None
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise InvalidArgumentError(f"The history is not JSON ({exc}); pass what `weft export` wrote.") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidArgumentError(
            f'A history is a JSON object with "format": "{FORMAT}", as `manage.py weft export ID` writes it.'
        )
    try:
        steps = {
            int(s["seq"]): StepRecord(
                int(s["seq"]),
                str(s["kind"]),
                str(s.get("name") or ""),
                str(s["status"]),
                s.get("result"),
                s.get("error"),
                int(s.get("attempts") or 0),
                _parse(s.get("started_at")),
                _parse(s.get("completed_at")),
            )
            for s in data.get("steps", [])
        }
        applied = [
            AppliedRecord(
                int(a["seq"]),
                int(a["n"]),
                str(a["name"]),
                str(a["payload"]),
                a.get("result"),
                a.get("error"),
                a.get("update_id"),
            )
            for a in data.get("applied", [])
        ]
        history = StoredHistory(
            workflow_id=str(data["workflow_id"]),
            run_id=str(data["run_id"]),
            workflow_type=str(data["workflow_type"]),
            version=str(data.get("version") or "1"),
            status=str(data["status"]),
            input=str(data["input"]),
            result=data.get("result"),
            error=data.get("error"),
            started_at=_parse(data.get("started_at")),
            created_at=_parse(data.get("created_at")),
            steps=steps,
            applied=applied,
            timer_seqs={int(seq) for seq in data.get("timer_seqs", [])},
            timer_kinds={int(seq): str(kind) for seq, kind in (data.get("timer_kinds") or {}).items()},
            fork_origin=data.get("fork_origin"),
        )
        Lineage.from_json(history.fork_origin, history.run_id)  # CorruptPayloadError: a ValueError
        return history
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"The history is not a valid {FORMAT} object ({type(exc).__name__}: {exc})."
        ) from None


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _parse(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if value else None
