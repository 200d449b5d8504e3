"""fenced_commit: the ONLY way an engine writes workflow-scoped state.

One transaction whose first statement locks, in workflow_id order, the claim rows that match
(workflow_id, epoch, engine_id) = (id, my epoch, me). A takeover's UPDATE and every external
transition lock the same row, so they wait for us or we for them: a write lands only under the
current epoch. Workflows whose row did not come back are re-read (another epoch = deposed, no holder =
released) and their writes dropped; the rest commit together (one fsync for many workflows' steps).

On SQLite, IMMEDIATE transactions take the write lock at BEGIN, so the plain read is the fence.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from ..models import BufferedSignal, PendingUpdate, Step, Timer, Workflow
from ..notify import send_many
from ..status import SignalState, UpdateStatus
from .driver import StepRecord

logger = logging.getLogger(__name__)
CLAIM_TABLE = "weft_django_workflowclaim"


@dataclasses.dataclass
class Finish:
    status: str  # a terminal status
    result: str | None = None
    error: dict[str, Any] | None = None


@dataclasses.dataclass
class WorkflowWrites:
    """Everything one workflow wants committed in the next fenced commit."""

    workflow_id: str
    run_id: str
    epoch: int
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    timers_add: list[Timer] = dataclasses.field(default_factory=list)
    timers_delete: list[int] = dataclasses.field(default_factory=list)
    signals_consumed: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (signal pk, seq)
    finish: Finish | None = None
    stuck: dict[str, Any] | None = None  # {"error": {...}, "retry_at": datetime}
    clear_stuck: bool = False

    @property
    def empty(self) -> bool:
        return not (
            self.steps
            or self.timers_add
            or self.timers_delete
            or self.signals_consumed
            or self.finish
            or self.stuck
            or self.clear_stuck
        )


@dataclasses.dataclass
class FenceResult:
    committed: set[str]
    lost: dict[str, str]  # workflow id -> "deposed" | "released" | "missing"


def lock_claims(engine_id: str, epochs: dict[str, int], using: str) -> set[str]:
    """Inside a transaction: lock the claims still held at these epochs; return their workflow ids."""
    connection = connections[using]
    ids = sorted(epochs)
    if not ids:
        return set()
    lock = " FOR NO KEY UPDATE" if connection.vendor == "postgresql" else ""
    held: set[str] = set()
    with connection.cursor() as cursor:
        for chunk in _chunks(ids, 500):
            placeholders = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"SELECT workflow_id, epoch FROM {CLAIM_TABLE} WHERE engine_id = %s AND workflow_id IN ({placeholders})"
                f" ORDER BY workflow_id{lock}",
                [engine_id, *chunk],
            )
            held.update(wid for wid, epoch in cursor.fetchall() if epochs[wid] == epoch)
    return held


def why_lost(engine_id: str, workflow_ids: list[str], using: str) -> dict[str, str]:
    with connections[using].cursor() as cursor:
        placeholders = ", ".join(["%s"] * len(workflow_ids))
        cursor.execute(
            f"SELECT workflow_id, engine_id FROM {CLAIM_TABLE} WHERE workflow_id IN ({placeholders})",
            workflow_ids,
        )
        rows = dict(cursor.fetchall())
    return {
        wid: "missing" if wid not in rows else ("released" if rows[wid] is None else "deposed") for wid in workflow_ids
    }


def fenced_commit(engine_id: str, batch: list[WorkflowWrites], now: datetime, using: str) -> FenceResult:
    """Commit every workflow's writes whose claim this engine still holds at the stated epoch."""
    batch = [writes for writes in batch if not writes.empty]
    if not batch:
        return FenceResult(set(), {})
    epochs = {writes.workflow_id: writes.epoch for writes in batch}
    with transaction.atomic(using=using):
        held = lock_claims(engine_id, epochs, using)
        kept = [writes for writes in batch if writes.workflow_id in held]
        if kept:
            _apply(engine_id, kept, now, using)
    lost_ids = sorted(set(epochs) - held)
    lost = why_lost(engine_id, lost_ids, using) if lost_ids else {}
    for wid, reason in lost.items():
        logger.warning("fenced commit refused workflow=%s engine=%s reason=%s", wid, engine_id, reason)
    return FenceResult(held, lost)


def _apply(engine_id: str, batch: list[WorkflowWrites], now: datetime, using: str) -> None:
    steps = [
        Step(
            workflow_id=w.workflow_id,
            run_id=w.run_id,
            seq=s.seq,
            kind=s.kind,
            name=s.name,
            status=s.status,
            result=s.result,
            error=s.error,
            attempts=s.attempts,
            epoch=w.epoch,
            started_at=s.started_at or now,
            completed_at=s.completed_at if s.completed_at or not s.settled else now,
        )
        for w in batch
        for s in w.steps
    ]
    if steps:
        Step.objects.using(using).bulk_create(
            steps,
            update_conflicts=True,
            unique_fields=["run_id", "seq"],
            update_fields=["kind", "name", "status", "result", "error", "attempts", "epoch", "completed_at"],
        )
    timers = [t for w in batch for t in w.timers_add]
    if timers:
        Timer.objects.using(using).bulk_create(timers)
    doomed = [pk for w in batch for pk in w.timers_delete]
    if doomed:
        Timer.objects.using(using).filter(pk__in=doomed).delete()
    for w in batch:
        for signal_pk, seq in w.signals_consumed:
            BufferedSignal.objects.using(using).filter(pk=signal_pk).update(
                state=SignalState.CONSUMED, consumed_seq=seq
            )
        if w.stuck is not None:
            Workflow.objects.using(using).filter(pk=w.workflow_id).update(
                stuck_error=w.stuck["error"],
                stuck_retry_at=w.stuck["retry_at"],
                stuck_attempts=w.stuck["attempts"],
                updated_at=now,
            )
        elif w.clear_stuck:
            Workflow.objects.using(using).filter(pk=w.workflow_id).update(
                stuck_error=None, stuck_retry_at=None, stuck_attempts=0
            )
    finished = [w for w in batch if w.finish is not None]
    if finished:  # one UPDATE for every run this commit ends
        Workflow.objects.using(using).bulk_update(
            [
                Workflow(
                    id=w.workflow_id,
                    status=w.finish.status,
                    result=w.finish.result,
                    error=w.finish.error,
                    finished_at=now,
                    updated_at=now,
                    current_step="",
                )
                for w in finished
                if w.finish is not None
            ],
            ["status", "result", "error", "finished_at", "updated_at", "current_step"],
        )
    released = [w.workflow_id for w in batch if w.finish is not None or w.stuck is not None]
    if finished:
        _close_mailboxes([w.workflow_id for w in finished], now, using)
    if released:
        release_locked_claims(engine_id, released, using)
        send_many("r", [w.workflow_id for w in finished], using)


def _close_mailboxes(workflow_ids: list[str], now: datetime, using: str) -> None:
    """The terminal commit: unconsumed signals are dropped, admitted updates fail, timers go."""
    BufferedSignal.objects.using(using).filter(workflow_id__in=workflow_ids, state=SignalState.BUFFERED).update(
        state=SignalState.DROPPED
    )
    PendingUpdate.objects.using(using).filter(workflow_id__in=workflow_ids, status=UpdateStatus.ADMITTED).update(
        status=UpdateStatus.FAILED,
        completed_at=now,
        error={
            "type": "WorkflowTerminalError",
            "message": "The workflow ended before the update was applied.",
        },
    )
    Timer.objects.using(using).filter(workflow_id__in=workflow_ids).delete()


def release_locked_claims(engine_id: str, workflow_ids: list[str], using: str) -> None:
    """Clear the holder, keep the epoch, for claims this transaction has locked at our epochs (the
    fence already proved them ours): one statement for the whole batch."""
    with connections[using].cursor() as cursor:
        for chunk in _chunks(sorted(workflow_ids), 500):
            marks = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"UPDATE {CLAIM_TABLE} SET engine_id = NULL, claimed_at = NULL, expires_at = NULL "
                f"WHERE engine_id = %s AND workflow_id IN ({marks})",
                [engine_id, *chunk],
            )


def release_claims(engine_id: str, epochs: dict[str, int], using: str) -> None:
    """Clear the holder, keep the epoch, only where the claim is still ours at that epoch."""
    with connections[using].cursor() as cursor:
        for wid, epoch in sorted(epochs.items()):
            cursor.execute(
                f"UPDATE {CLAIM_TABLE} SET engine_id = NULL, claimed_at = NULL, expires_at = NULL "
                f"WHERE workflow_id = %s AND epoch = %s AND engine_id = %s",
                [wid, epoch, engine_id],
            )


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
