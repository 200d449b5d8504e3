"""Continue-as-new in the fenced commit (``WorkflowWrites.continued``): the run ends and a fresh run
of the same workflow id starts, with new input and an empty history, in the engine's one fenced
commit (the claim is locked as ours at our epoch before this runs).

What the commit writes for each continuing run, in order:

- a ``ContinuedRun`` row: the run that ended (its id, input, step count) and the one that follows;
- the workflow row: the new run id, input and version, running, no result, error or stuck mark; its
  parent link, schedule, idempotency key, execution deadline and trace context are kept (a parent
  waiting for it gets the end of the last run of the chain);
- the old run's timers are deleted; its unconsumed signals and admitted updates are carried over to
  the new run (nothing sent meanwhile is lost); updates a wait_for_update took and never answered
  fail as they would at the run's end; its children's end records (``__weft_child__:<seq>``) are
  dropped, as at a run's end (the new run's child steps start at seq 0 again);
- the old run's active children are closed per their parent_close_policy, as at a run's end
  (``terminate`` and ``request_cancel`` cancel them; the commit locked their claims);
- the claim is released at its epoch, runnable (``store.claims``; the claim row is the only thing
  claims/ writes): an engine acquires the new run with a new epoch, so nothing late of the old
  run's epoch can write to it; a ``w:`` wake-up announces it.

Signals or updates that commit after this while addressed to the old run (the sender read the row
before this commit) are carried over by ``carry_late`` (the mailbox sweep), never dropped.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Subquery

from ..models import BufferedSignal, ContinuedRun, PendingUpdate, Step, Timer, Workflow
from ..status import ACTIVE_STATUSES, SignalState, UpdateStatus, WorkflowStatus
from . import claims, mailbox
from .mailbox import CHILD_MAILBOX_PREFIX
from .notify import send_many
from .sessions import write_unlocked


def continue_runs(engine_id: str, batch: list[Any], now: datetime, using: str, hooks: Any = None) -> None:
    """Write the continuations of these workflows (``WorkflowWrites`` with ``continued`` set), in
    the caller's fenced transaction.

    Args:
        engine_id: the committing engine (it holds the claims, locked).
        batch: the continuing workflows' writes.
        now: workflow time (the old run's end, the new run's start).
        using: the connection alias.
        hooks: the fenced commit's ``CommitHooks``: the old run's active children are closed per their
            parent_close_policy, as at a run's end (the commit locked their claims).
    """
    if not batch:
        return
    for w in batch:
        new = w.continued
        old = (
            Workflow.objects.using(using)
            .filter(pk=w.workflow_id, run_id=w.run_id)
            .values_list("workflow_type", "version", "input", "started_at")
            .first()
        )
        if old is None:  # the fence held, so the row is ours; a missing row means nothing to continue
            continue
        workflow_type, version, input_text, started_at = old
        if hooks is not None and w.started_children and _has_active_children(w.workflow_id, w.run_id, using):
            hooks.close_children(w.workflow_id, w.run_id, "continued as new", using)
        ContinuedRun.objects.using(using).create(
            workflow_id=w.workflow_id,
            run_id=w.run_id,
            next_run_id=new.run_id,
            workflow_type=workflow_type,
            version=version,
            input=input_text,
            steps=Step.objects.using(using).filter(run_id=w.run_id).count(),
            started_at=started_at,
            finished_at=now,
        )
        Workflow.objects.using(using).filter(pk=w.workflow_id).update(
            run_id=new.run_id,
            input=new.input_text,
            version=new.version,
            status=WorkflowStatus.RUNNING,
            result=None,
            error=None,
            started_at=now,
            finished_at=None,
            updated_at=now,
            current_step="",
            stuck_error=None,
            stuck_retry_at=None,
            stuck_attempts=0,
        )
        Timer.objects.using(using).filter(workflow_id=w.workflow_id, run_id=w.run_id).delete()
        carry(w.workflow_id, w.run_id, new.run_id, now, using)
    ids = [w.workflow_id for w in batch]
    claims.release_locked_claims(engine_id, ids, using, ended=[])
    send_many("w", ids, using)


def _has_active_children(workflow_id: str, run_id: str, using: str) -> bool:
    return (
        Workflow.objects.using(using)
        .filter(parent_id=workflow_id, parent_run_id=run_id, status__in=list(ACTIVE_STATUSES))
        .exists()
    )


def carry(workflow_id: str, old_run_id: Any, new_run_id: Any, now: datetime, using: str) -> None:
    """Move the old run's unconsumed signals and admitted updates to the new run; fail the updates
    it took with wait_for_update and never answered (TAKEN_ERROR, as at a run's end). The old run's
    child-terminal records are not signals of the workflow but ends of its own children: they are
    dropped, as at a run's end (the new run's children report under the same reserved names)."""
    signals = BufferedSignal.objects.using(using).filter(
        workflow_id=workflow_id, run_id=old_run_id, state=SignalState.BUFFERED
    )
    signals.filter(name__startswith=CHILD_MAILBOX_PREFIX).update(state=SignalState.DROPPED)
    signals.exclude(name__startswith=CHILD_MAILBOX_PREFIX).update(run_id=new_run_id)
    updates = PendingUpdate.objects.using(using).filter(workflow_id=workflow_id, run_id=old_run_id)
    updates.filter(status=UpdateStatus.ADMITTED).update(run_id=new_run_id)
    updates.filter(status=UpdateStatus.ACCEPTED).update(
        status=UpdateStatus.FAILED, error=dict(mailbox.TAKEN_ERROR), completed_at=now
    )


def carry_late(using: str) -> int:
    """The mailbox sweep's part: signals and admitted updates that committed for a run after it
    continued as new are moved to the workflow's current run (while it is active), and a ``w:`` wake-up
    sent for each workflow moved to. Returns how many.

    Not moved, left to ``mailbox.drop_late_signals`` (the next part of the sweep), which drops them as
    signals of a run that is no longer active: child-terminal records (the end of a child of the old
    run, not of the new run's step at that seq) and a signal whose id the current run already has
    (sent to both runs: on one run the second send is a no-op too). An admitted update whose
    idempotency key the current run already has stays too; the sweep fails it as an update of a run
    that ended (``WorkflowTerminalError``), never as an error of the sweep."""
    current = Workflow.objects.using(using).filter(pk=OuterRef("workflow_id"), status__in=list(ACTIVE_STATUSES))
    signals = BufferedSignal.objects.using(using).exclude(name__startswith=CHILD_MAILBOX_PREFIX)
    late_signals, moved_signals = _move_late(signals, "state", SignalState.BUFFERED, "signal_id", current, using)
    updates = PendingUpdate.objects.using(using).all()
    late_updates, moved_updates = _move_late(
        updates, "status", UpdateStatus.ADMITTED, "idempotency_key", current, using
    )
    send_many("w", sorted({*late_signals, *late_updates}), using)  # their holders look now
    return moved_signals + moved_updates


def _move_late(rows: Any, state: str, waiting: str, key: str, current: Any, using: str) -> tuple[set[str], int]:
    """Move the waiting rows (``state`` = ``waiting``) of continued runs to their workflow's current
    run, at most 1,000. A row whose ``key`` the current run already has stays (a duplicate there), and
    of several with one key on earlier runs only the lowest pk moves: the UPDATE never makes two rows
    of one key on a run. Returns (the workflows moved to, how many rows)."""
    continued = ContinuedRun.objects.using(using).values("run_id")
    earlier_same = rows.model.objects.using(using).filter(
        workflow_id=OuterRef("workflow_id"),
        run_id__in=continued,
        pk__lt=OuterRef("pk"),
        **{key: OuterRef(key), state: waiting},
    )
    late = rows.filter(mailbox.to_be_carried(rows.model, key, using), ~Exists(earlier_same))
    # Read first, write only what was found (on SQLite an UPDATE that matches nothing still locks).
    found = dict(late.filter(**{state: waiting}).values_list("pk", "workflow_id")[:1000])
    if not found:
        return set(), 0
    # still active at the write; a row another transaction holds (a cancel() in a user's open
    # transaction closes every run's mail of the workflow) is left for a later pass, never waited for
    still = rows.model.objects.using(using).filter(Exists(current), pk__in=list(found), **{state: waiting})
    moved = write_unlocked(still, {"run_id": Subquery(current.values("run_id")[:1])}, using)
    return set(found.values()), moved
