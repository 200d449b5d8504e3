"""Child workflows. A parent starts a child in its own fenced commit: the child's row and an unheld
claim are written there, and a wake-up lets any engine claim it, so a fan-out spreads over every
engine instead of piling onto the parent's. A child that ends, on whatever engine or through whatever
transition, writes a durable child-terminal record into its parent's mailbox: a buffered signal with
a reserved name and id, so it is written once and consumed with the step that waits for it. The
parent's owner, wherever it runs, is woken by NOTIFY and delivers it like any signal."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from .. import events
from ..codec import decode, encode
from ..epochs import next_epoch
from ..models import BufferedSignal, Workflow, WorkflowClaim
from ..notify import send_many
from .driver import CORRUPT_RECORD, Outcome

MAILBOX_PREFIX = "__weft_child__:"
MAX_DEPTH = 10


def mailbox_name(seq: int) -> str:
    """The reserved signal name (and signal id) under which a child reports to the step ``seq``."""
    return f"{MAILBOX_PREFIX}{seq}"


@dataclasses.dataclass
class ChildStart:
    child_id: str
    workflow_type: str
    version: str
    input_text: str
    parent_id: str
    parent_run_id: str
    parent_seq: int
    parent_close_policy: str
    depth: int
    run_id: str = ""


def start_children(
    engine_id: str, children: list[ChildStart], now: datetime, ttl: timedelta, using: str
) -> dict[str, int]:
    """Inside the parent's fenced commit: insert each child's row and an unheld claim with a fresh epoch,
    and wake the engines. A child id that is already taken is reported to the parent as a failure."""
    import uuid

    claimed: dict[str, int] = {}
    for child in children:
        child.run_id = str(uuid.uuid4())
        try:
            with transaction.atomic(using=using):
                Workflow.objects.using(using).create(
                    id=child.child_id,
                    run_id=child.run_id,
                    workflow_type=child.workflow_type,
                    version=child.version,
                    status="running",
                    input=child.input_text,
                    parent_id=child.parent_id,
                    parent_run_id=child.parent_run_id,
                    parent_seq=child.parent_seq,
                    parent_close_policy=child.parent_close_policy,
                    depth=child.depth,
                    created_at=now,
                    updated_at=now,
                    started_at=now,
                )
                epoch = next_epoch(using)
                WorkflowClaim.objects.using(using).create(workflow_id=child.child_id, epoch=epoch, run_created_at=now)
                claimed[child.child_id] = epoch
                events.child_started(child, using)  # the signal waits for the parent's commit
        except IntegrityError:
            report_child_end(
                child.child_id,
                child.parent_id,
                child.parent_run_id,
                child.parent_seq,
                "failed",
                None,
                {
                    "type": "WorkflowAlreadyExistsError",
                    "message": f'A workflow "{child.child_id}" already exists; give the child another id.',
                },
                now,
                using,
            )
    send_many("w", list(claimed), using)
    return claimed


def report_child_end(
    child_id: str,
    parent_id: str,
    parent_run_id: str,
    parent_seq: int,
    status: str,
    result_text: str | None,
    error: dict[str, Any] | None,
    now: datetime,
    using: str,
) -> None:
    """Write the child-terminal record into the parent's mailbox (idempotent by its reserved id)."""
    name = mailbox_name(parent_seq)
    payload = encode({"child_id": child_id, "status": status, "result": result_text, "error": error})
    BufferedSignal.objects.using(using).bulk_create(
        [
            BufferedSignal(
                workflow_id=parent_id,
                run_id=parent_run_id,
                name=name,
                signal_id=name,
                payload=payload,
                created_at=now,
            )
        ],
        ignore_conflicts=True,
    )
    send_many("w", [parent_id], using)


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
