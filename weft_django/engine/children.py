"""Child workflows. A parent starts a child in its own fenced commit: the child's row and an unheld
claim are written there, and a wake-up lets any engine claim it, so a fan-out spreads over every
engine instead of piling onto the parent's. A child that ends, on whatever engine or through whatever
transition, writes a durable child-terminal record into its parent's mailbox: a buffered signal with
a reserved name and id, so it is written once and consumed with the step that waits for it. The
parent's owner, wherever it runs, is woken by NOTIFY and delivers it like any signal.

The statements (the child's row and claim, the child-terminal record) are in
``weft_django.store.children``, and run inside the parent's fenced commit (``store.commit``): the
parent's claim is locked there before they write, so they need no fence of their own. What stays here
is how the parent reads a child's end."""

from __future__ import annotations

from ..codec import decode
from .driver import CORRUPT_RECORD, Outcome

MAX_DEPTH = 10

__all__ = [
    "MAX_DEPTH",
    "child_outcome",
]


def child_outcome(payload_text: str) -> Outcome:
    """The parent's view of a child-terminal record: the child's result, or a ChildWorkflowError.
    A record that cannot be read settles the step with a CorruptRecord error, kept with the step: the
    parent gets stuck on it (live and on every replay), not the engine."""
    try:
        return _child_outcome(payload_text)
    except Exception as exc:
        message = f"the child-terminal record {payload_text!r:.80} cannot be read ({type(exc).__name__}: {exc})"
        return Outcome(ok=False, error={"exc": CORRUPT_RECORD, "message": message, "record": payload_text[:2000]})


def _child_outcome(payload_text: str) -> Outcome:
    record = decode(payload_text)
    if record["status"] == "completed":
        return Outcome(ok=True, text=record["result"])
    error = record.get("error") or {}
    message = f'Child workflow "{record["child_id"]}" ended {record["status"]}'
    if error.get("message"):
        message += f": {error.get('type', 'Error')}: {error['message']}"
    return Outcome(
        ok=False,
        error={
            "exc": "ChildWorkflowError",
            "message": message,
            "child_id": record["child_id"],
            "status": record["status"],
            "error": error,
        },
    )
