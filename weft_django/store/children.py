"""Child runs, engine side: a parent's fenced commit inserts each child's row and unheld claim, and
a child that ends writes its child-terminal record into its parent's mailbox (a buffered signal
with a reserved name and id, written once). See ``weft_django.engine.children`` for the rules."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction

from ..models import Workflow
from ..status import TERMINAL_STATUSES
from . import claims
from .epochs import next_epoch, next_epochs
from .mailbox import CHILD_MAILBOX_PREFIX, child_mailbox_name, report_child_end
from .notify import send_many
from .runs_bulk import chunks_by_input

# A child reports to its parent's mailbox (store/mailbox.py holds the one writer of that record).
MAILBOX_PREFIX = CHILD_MAILBOX_PREFIX
mailbox_name = child_mailbox_name


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
    trace_context: str | None = None  # the parent's (weft_django.tracing): the child's run joins its trace
    queue: str | None = None  # a child in a queue is pending until an engine admits it (store/queues.py)
    priority: int = 0
    concurrency_key: str | None = None


def start_children(
    engine_id: str,
    children: list[ChildStart],
    now: datetime,
    ttl: timedelta,
    using: str,
    on_started: Callable[[ChildStart, str], None] | None = None,
) -> dict[str, int]:
    """Inside the parent's fenced commit (its claim is locked already): insert each child's row and an
    unheld claim with a fresh epoch, and wake the engines. A child id that is already taken is
    reported to the parent as a failure.

    All of them are inserted together (a few statements, however many children: a fan-out of thousands
    wrote them one at a time, five statements each, inside the parent's commit on the engine loop's
    thread); when one's id is taken, that savepoint rolls back and each is inserted alone, so the taken
    one is reported and the others start.

    Args:
        engine_id: the parent's engine (unused by the rows: a child's claim starts unheld).
        children: the children to start; ``now``: workflow time; ``ttl``: unused (kept for callers).
        on_started: called with each child started and ``using``, inside the transaction.

    Returns:
        {child id: epoch} of the children started.
    """
    for child in children:
        child.run_id = str(uuid.uuid4())
    claimed: dict[str, int] | None = None
    if len(children) > 1:
        try:
            with transaction.atomic(using=using):
                claimed = _insert_together(children, now, using)
        except IntegrityError:
            claimed = None  # an id is taken: one at a time below, which reports it
    if claimed is None:
        claimed = {}
        for child in children:
            epoch = _insert_alone(child, now, using)
            if epoch is not None:
                claimed[child.child_id] = epoch
    if on_started is not None:
        for child in children:
            if child.child_id in claimed:
                on_started(child, using)  # the signal waits for the parent's commit
    send_many("w", list(claimed), using)
    return claimed


def _row(child: ChildStart, now: datetime) -> Workflow:
    return Workflow(
        id=child.child_id,
        run_id=child.run_id,
        workflow_type=child.workflow_type,
        version=child.version,
        status="pending" if child.queue is not None else "running",
        input=child.input_text,
        parent_id=child.parent_id,
        parent_run_id=child.parent_run_id,
        parent_seq=child.parent_seq,
        parent_close_policy=child.parent_close_policy,
        depth=child.depth,
        trace_context=child.trace_context,
        created_at=now,
        updated_at=now,
        started_at=None if child.queue is not None else now,
        queue=child.queue,
        priority=child.priority,
        concurrency_key=child.concurrency_key,
    )


def _insert_together(children: list[ChildStart], now: datetime, using: str) -> dict[str, int]:
    """Every child's row, then every claim at an epoch drawn after the rows (as one alone draws it).

    Raises:
        IntegrityError: a child's id is taken (the caller's savepoint rolls all of them back).
    """
    chunks = list(chunks_by_input(children))  # statements PostgreSQL takes: each input may be 1 MiB
    for chunk in chunks:
        Workflow.objects.using(using).bulk_create([_row(child, now) for child in chunk])
    epochs = iter(next_epochs(len(children), using))
    claimed: dict[str, int] = {}
    for chunk in chunks:
        rows = [(child.child_id, next(epochs), child.queue is None) for child in chunk]
        # A child waiting in its queue stays out of acquire's index until its admission.
        claims.insert_unheld_many(rows, now, using)
        claimed.update((wid, epoch) for wid, epoch, _ in rows)
    return claimed


def _insert_alone(child: ChildStart, now: datetime, using: str) -> int | None:
    """One child's row and claim in a savepoint of its own: its epoch, or None when its id is taken
    (reported to the parent: its own child's end again, or a failure)."""
    try:
        with transaction.atomic(using=using):
            _row(child, now).save(using=using, force_insert=True)
            epoch = next_epoch(using)
            claims.insert_unheld(child.child_id, epoch, now, using, runnable=child.queue is None)
            return epoch
    except IntegrityError:
        if _report_own_child(child, now, using):
            return None
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
        return None


def _report_own_child(child: ChildStart, now: datetime, using: str) -> bool:
    """Whether the id taken is this very child of this parent's step (the parent was retried from that
    step): then its end, if it ended, is reported again; a child still running reports its own. Only a
    child of the workflow type asked for is: a parent retried under code that starts another workflow
    at that step did not start the old one, so its id is taken, as by any other workflow."""
    own = {
        "parent_id": child.parent_id,
        "parent_run_id": child.parent_run_id,
        "parent_seq": child.parent_seq,
        "workflow_type": child.workflow_type,
    }
    found = Workflow.objects.using(using).filter(id=child.child_id, **own).values("status", "result", "error").first()
    if found is None:
        return False
    if found["status"] in TERMINAL_STATUSES:
        report_child_end(
            child.child_id,
            child.parent_id,
            child.parent_run_id,
            child.parent_seq,
            found["status"],
            found["result"],
            found["error"],
            now,
            using,
        )
    return True
