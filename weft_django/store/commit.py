"""The fenced commit: the one transaction boundary for workflow-scoped writes.

The engine's batch commit (``fenced_commit``), the client-side transitions (cancel, suspend, resume,
retry, purge), a parent's children, update settlement and Celery completions all write through here:
one transaction whose first statement locks the claims (sorted, one statement) and whose writes count
only where the lock proved the writer's epoch.

``fenced_commit``: one transaction whose first statement locks, in workflow_id order, the claim rows
that match (workflow_id, epoch, engine_id) = (id, my epoch, me). A takeover's UPDATE and every
external transition lock the same row, so they wait for us or we for them: a write lands only under
the current epoch. Workflows whose row did not come back are re-read (another epoch = deposed, no
holder = released) and their writes dropped; the rest commit together (one fsync for many workflows'
steps). Where the backend ``batches_statements`` (PostgreSQL) the common commit (steps, consumed
signals, runs ending) is ONE autocommit statement whose first CTE takes that same lock
(``store.commit_statement``, ADR 0003). On SQLite, IMMEDIATE transactions take the write lock at
BEGIN, so the plain read is the fence.

``fenced``: the entry point for every other workflow-scoped transaction (see its docstring).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Q

from ..models import AppliedUpdate, Step, Timer, Workflow
from ..status import ACTIVE_STATUSES, StepStatus, UpdateStatus
from . import claims, continuation, mailbox, notify, sessions, visibility
from .backend import backend
from .children import ChildStart, start_children
from .claims import FAMILY_LOCK_ROUNDS, active_descendants
from .commit_statement import (
    ONE_STATEMENT_MAX_WORKFLOWS,
    commit_in_one_statement,
    run_write_statement,
    step_columns_known,
)
from .commit_statement import fits_one_statement as _fits_one_statement
from .notify import send_many
from .writes import FenceResult, Finish, UpdateDone, UpdateRaceLost, WorkflowWrites, latest_per_seq

logger = logging.getLogger("weft_django.engine.fencing")  # the name the docs and operators know

__all__ = [
    "ONE_STATEMENT_MAX_WORKFLOWS",
    "CommitHooks",
    "Fence",
    "FenceResult",
    "Finish",
    "UpdateDone",
    "UpdateRaceLost",
    "WorkflowWrites",
    "apply_messages",
    "fenced",
    "fenced_commit",
    "fenced_messages",
    "write_steps",
]

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


@dataclasses.dataclass(frozen=True)
class CommitHooks:
    """What the batch commit calls back into the layers above, inside its transaction:
    ``close_children(parent_id, parent_run_id, status, using)`` applies the parent-close policy to
    the active children of a run that ended (the client side's transitions); ``child_started(child,
    using)`` raises the event of a child run started (sent once the commit lands)."""

    close_children: Callable[[str, str, str, str], None]
    child_started: Callable[[ChildStart, str], None] | None = None


@dataclasses.dataclass
class Fence:
    """What ``fenced`` locked: ``held``, the requested workflows whose claim it locked (under the
    stated holder and epochs, if any); ``family``, the active descendants' claims locked with them."""

    held: set[str]
    family: set[str] = dataclasses.field(default_factory=set)


@contextmanager
def fenced(
    workflow_ids: Iterable[str],
    using: str,
    *,
    holder: tuple[str | None, Mapping[str, int]] | None = None,
    family: bool = False,
    wait: bool = True,
) -> Iterator[Fence]:
    """The one transaction boundary for a workflow-scoped write that is not the engine's batch commit.

    Opens ``transaction.atomic(using)`` and, before anything else, locks the claim rows of
    ``workflow_ids`` through ``store.claims``, sorted by workflow id, in one statement (the global
    lock order: it cannot deadlock against a batch commit or a takeover). Yields what it locked; the
    caller writes only for the workflows in ``Fence.held``. Leaving the block commits (an exception
    rolls back). Nested in an outer transaction it is a savepoint and the locks last until the outer
    commit. Used by update settlement, Celery completions and expiries (engine side) and, after issue
    15's merge, by the client-side transitions (cancel, suspend, resume, retry, time out, purge).

    Args:
        workflow_ids: the workflows whose claims to lock.
        using: the connection alias.
        holder: None locks the claims whoever holds them (a transition); ``(engine_id, epochs)``
            only those still held by ``engine_id`` at ``epochs[workflow_id]``; ``(None, epochs)``
            those still at ``epochs`` while some engine holds them (a Celery worker, which holds none).
        family: also lock the claims of the workflows' active descendants (a run that ends closes
            them), re-reading them until none appears unlocked (a child started concurrently); where
            the lock waits, a round whose family grew lets its locks go and the next takes them all.
        wait: False skips claim rows another transaction holds (never wait on the engine's loop);
            they are then missing from ``held``, and ``store.claims.classify_unheld`` says why.

    Raises:
        django.db.DatabaseError: a statement failed (the transaction is rolled back).
    """
    ids = sorted(set(workflow_ids))
    with transaction.atomic(using=using):
        yield _take(ids, using, holder, family, wait)


def _take(
    ids: list[str], using: str, holder: tuple[str | None, Mapping[str, int]] | None, family: bool, wait: bool
) -> Fence:
    if holder is not None:
        engine_id, at = holder
        epochs = {wid: at[wid] for wid in ids}
        if engine_id is None:
            return Fence(claims.lock_at_epochs(epochs, using, wait=wait))
        if not family:
            return Fence(claims.lock_claims(engine_id, epochs, using, wait=wait))
    if not family:
        return Fence(claims.lock_ids(ids, using, wait=wait))
    rows = Workflow.objects.using(using)
    runs = {
        wid: str(run)
        for chunk in backend(using).chunks(ids)
        for wid, run in rows.filter(pk__in=chunk).values_list("pk", "run_id")
    }
    # The family is read first and locked with the runs in ONE statement in workflow_id order (a child's
    # id may sort below its parent's: locked after it, two family transitions could deadlock).
    wanted: set[str] = set(ids) | {child for group in active_descendants(runs, using).values() for child in group}
    locked: set[str] = set()
    held: set[str] = set()
    # A lock that waits (a transition) takes each round from nothing held: its locks of a round whose
    # family grew are let go (the round's savepoint rolled back) and the next round takes them all again
    # in one sorted statement. Kept and added to, a descendant that sorts below a member already held was
    # locked out of order, and a cancel of that member (locking the descendant first) deadlocked with it.
    retake = wait and backend(using).skips_locked and (holder is None or holder[0] is None)
    for round_left in reversed(range(FAMILY_LOCK_ROUNDS)):
        # A child started between the read and the lock (its parent's commit, before ours got the
        # parent's claim) is found by the next read; once the parent's claim is ours, none can appear.
        mark = transaction.savepoint(using) if retake and round_left else None
        if holder is not None and holder[0] is not None:
            mine, others = claims.lock_batch_and_family(
                holder[0], {wid: holder[1][wid] for wid in ids}, wanted - set(ids), using
            )
            held |= mine
            locked |= others | mine
        else:
            got = claims.lock_ids(sorted(wanted), using, wait=wait)
            held |= got & set(ids)
            locked |= got
        descendants = {child for group in active_descendants(runs, using).values() for child in group}
        if descendants <= locked:
            if mark is not None:
                transaction.savepoint_commit(mark, using)
            break
        wanted = locked | descendants
        if mark is not None:
            transaction.savepoint_rollback(mark, using)  # the row locks of this round go with it
            held, locked = set(), set()
    return Fence(held, locked - set(ids))


def fenced_commit(
    engine_id: str,
    batch: list[WorkflowWrites],
    now: datetime,
    using: str,
    claim_ttl: timedelta | None = None,
    *,
    hooks: CommitHooks,
) -> FenceResult:
    """Commit every workflow's writes whose claim this engine still holds at the stated epoch.

    The fence never waits for a row another transaction holds (SKIP LOCKED): such a workflow is
    returned in ``busy`` with nothing written, so one user transaction holding one claim cannot stall
    the rest of the batch; the engine carries its writes to the next pass. A workflow one of whose
    guarded steps another transaction settled (``WorkflowWrites.guards``) is returned in ``stale``,
    nothing written: its context is stale.

    Args:
        engine_id: the committing engine; ``batch``: the workflows' writes; ``now``: workflow time.
        using: the connection alias; ``claim_ttl``: the TTL of children's claims (default 30 s).
        hooks: the callbacks into the layers above (closing children, the child-started event).

    Raises:
        UpdateRaceLost: an update settled in the batch was no longer admitted (all rolled back).
        django.db.DatabaseError: a statement failed.
    """
    batch = [writes for writes in batch if not writes.empty]
    if not batch:
        return FenceResult(set(), {})
    epochs = {writes.workflow_id: writes.epoch for writes in batch}
    ttl = claim_ttl or timedelta(seconds=30)
    held: set[str] = set()
    busy: set[str] = set()
    stale: set[str] = set()
    children: dict[str, int] = {}
    if _fits_one_statement(batch, using) and not visibility.has_attributes(batch):
        held, deferred = commit_in_one_statement(engine_id, batch, now, using)
        batch = [writes for writes in batch if writes.workflow_id in deferred]
        held -= deferred
    if batch:  # the general path: lock (one sorted statement), then write, in one transaction
        # A row a user holds fails the commit soon, not at the session's TTL/2: SET LOCAL for this
        # transaction only (not inside a caller's, where it would outlast this savepoint).
        found = backend(using)
        bounded = found.bounds_sessions and not found.connection.in_atomic_block
        try:
            with transaction.atomic(using=using):
                if bounded and not found.joins_statements:  # otherwise sent with the lock (no round trip)
                    sessions.bound_commit_lock_wait(using)
                    bounded = False
                locked, families_busy = _lock_general(engine_id, batch, using, bounded)
                kept = [w for w in batch if w.workflow_id in locked and w.workflow_id not in families_busy]
                stale = settled_elsewhere(kept, using)  # their guarded step was settled by another transaction
                kept = [w for w in kept if w.workflow_id not in stale]
                if kept:
                    children = _apply(engine_id, kept, now, using, ttl, hooks)
        except DatabaseError as exc:
            if not (held and sessions.lock_wait_ended(exc)):
                raise
            # The one statement committed the others; these (ending with children) wait for a row a
            # user holds: carried, as if their claim were locked (the caller must not commit the rest again).
            locked, families_busy = set(), {w.workflow_id for w in batch}
        held |= locked - families_busy
        busy |= families_busy
    lost, skipped = claims.classify_unheld(
        engine_id, {wid: e for wid, e in epochs.items() if wid not in held | busy}, using
    )
    busy |= skipped
    for wid, reason in lost.items():
        logger.warning(
            "fenced commit refused workflow=%s engine=%s epoch=%s reason=%s", wid, engine_id, epochs[wid], reason
        )
    if busy:
        logger.info(
            "fenced commit deferred (rows locked by another transaction) engine=%s workflows=%s",
            engine_id,
            sorted(busy),
        )
    if stale:
        logger.warning(
            "fenced commit refused workflow(s) whose step another transaction settled engine=%s workflows=%s",
            engine_id,
            sorted(stale),
        )
    return FenceResult(held - stale, lost, children, busy, stale)


def _lock_general(engine_id: str, batch: list[WorkflowWrites], using: str, bounded: bool) -> tuple[set[str], set[str]]:
    """The general path's fence: our claims, plus the claims of the active descendants that the
    batch's finishing runs close, in one sorted statement that skips locked rows. Returns (our claims
    held, finishing runs whose family could not be locked whole: left for the next pass)."""
    epochs = {w.workflow_id: w.epoch for w in batch}
    # A run that continues as new closes its children too (store/continuation.py).
    ending = {
        w.workflow_id: w.run_id
        for w in batch
        if (w.finish is not None or w.continued is not None) and w.started_children
    }
    families = active_descendants(ending, using) if ending else {}
    members = {child for family in families.values() for child in family}
    if not members:
        return claims.lock_claims(engine_id, epochs, using, wait=False, bounded=bounded), set()
    held, locked = claims.lock_batch_and_family(engine_id, epochs, members, using, bounded=bounded)
    busy = {root for root, family in families.items() if root in held and not family <= locked}
    # A child started between the read and the lock (its parent's commit) is not locked: look again.
    again = active_descendants({root: ending[root] for root in families if root in held}, using)
    busy |= {root for root, family in again.items() if not family <= locked}
    return held, busy


def _close_families(
    engine_id: str,
    batch: list[WorkflowWrites],
    finished: list[WorkflowWrites],
    with_children: set[str],
    now: datetime,
    claim_ttl: timedelta,
    using: str,
    hooks: CommitHooks,
) -> dict[str, int]:
    """After both commit paths' writes: close the children of finished runs, tell their parents, and
    start the children the batch asked for. Returns the started children's claims."""
    ends = []
    for w in finished:
        assert w.finish is not None
        if w.workflow_id in with_children:
            hooks.close_children(w.workflow_id, w.run_id, w.finish.status, using)
        if w.parent is not None:
            ends.append(mailbox.ChildEnd(w.workflow_id, *w.parent, w.finish.status, w.finish.result, w.finish.error))
    mailbox.report_child_ends(ends, now, using)  # one insert and one wake-up statement for the batch's children
    # A run that ends or continues as new in this commit has had its children closed above (or by
    # continue_runs): the children it asked for in the same pass are not started after that.
    starts = [child for w in batch if w.finish is None and w.continued is None for child in w.children]
    return start_children(engine_id, starts, now, claim_ttl, using, hooks.child_started) if starts else {}


def _write_timers_and_stuck(batch: list[WorkflowWrites], now: datetime, using: str) -> None:
    """The rare parts both commit paths write with the ORM: timers added or deleted, stuck flags."""
    timers = [t for w in batch for t in w.timers_add]
    if timers:
        Timer.objects.using(using).bulk_create(timers)  # their pks are needed (a later delete by pk)
    doomed = [pk for w in batch for pk in w.timers_delete]
    for chunk in backend(using).chunks(doomed):
        Timer.objects.using(using).filter(pk__in=chunk).delete()
    for w in batch:
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


def _apply(
    engine_id: str,
    batch: list[WorkflowWrites],
    now: datetime,
    using: str,
    claim_ttl: timedelta,
    hooks: CommitHooks,
) -> dict[str, int]:
    if backend(using).batches_statements and step_columns_known():
        return _apply_in_one_statement(engine_id, batch, now, using, claim_ttl, hooks)
    write_steps(batch, now, using)
    apply_messages(batch, now, using)  # before the mailbox closes: a respond() in a terminal commit answers
    _write_timers_and_stuck(batch, now, using)
    visibility.write_batch(batch, using)
    for w in batch:
        mailbox.consume_signals(w.signals_consumed, using)
    finished = [w for w in batch if w.finish is not None]
    ended = ["status", "result", "error", "finished_at", "updated_at", "current_step"]
    # One UPDATE for every run this commit ends, per chunk of the database's parameter limit: Django's
    # bulk_update batches for 999 parameters, as if each run bound one per column, where it binds two
    # (CASE WHEN id = %s THEN %s) and its id once more.
    for chunk in backend(using).chunks(finished, per_item=2 * len(ended) + 1):
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
                for w in chunk
                if w.finish is not None
            ],
            ended,
        )
    released = [w.workflow_id for w in batch if w.finish is not None or w.stuck is not None]
    if finished:
        mailbox.close_ended([w.workflow_id for w in finished], now, using)
    if released:
        claims.release_locked_claims(engine_id, released, using, ended=[w.workflow_id for w in finished])
        notify.send_ended(
            [(w.workflow_id, w.finish.status, w.finish.result, w.finish.error, w.run_id) for w in finished if w.finish],
            using,
        )
    # After the batch's ends, as in the one-statement path: a child of a continuing run that ends in
    # this very commit is no longer active, so the continuation does not close it.
    continuation.continue_runs(engine_id, [w for w in batch if w.continued is not None], now, using, hooks)
    parents = [w.workflow_id for w in finished if w.started_children]
    with_children = _with_active_children(parents, using) if parents else set()
    return _close_families(engine_id, batch, finished, with_children, now, claim_ttl, using, hooks)


def _apply_in_one_statement(
    engine_id: str,
    batch: list[WorkflowWrites],
    now: datetime,
    using: str,
    claim_ttl: timedelta,
    hooks: CommitHooks,
) -> dict[str, int]:
    """As ``_apply``, with the common writes (steps, consumed signals, finished runs, their mailboxes,
    timers and claims, the ``r:`` wake-ups) in ONE statement of data-modifying CTEs, instead of one
    ORM statement each. The rare parts (updates, whose settlement must check its row count; timers;
    stuck runs; children) keep their own statements, before it or after it.

    All CTEs of one statement see the same snapshot and no row may be modified twice in it, so: the
    signals a finishing run consumes are excluded from the drop of its mailbox; everything the rare
    parts write first (timers added or deleted, stuck flags, update settlements) is visible to it."""
    apply_messages(batch, now, using)  # before the mailbox closes: a respond() in a terminal commit answers
    _write_timers_and_stuck(batch, now, using)
    visibility.write_batch(batch, using)
    finished = [w for w in batch if w.finish is not None]
    rows = run_write_statement(engine_id, batch, now, using, fence=False)
    continuation.continue_runs(engine_id, [w for w in batch if w.continued is not None], now, using, hooks)
    with_children = {value for kind, value in rows if kind == "p"}
    return _close_families(engine_id, batch, finished, with_children, now, claim_ttl, using, hooks)


def write_steps(batch: list[WorkflowWrites], now: datetime, using: str) -> None:
    """Upsert every step of the batch in one statement (a step is inserted when dispatched or settled
    and updated when it settles; its epoch is the committing owner's)."""
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
        for s in latest_per_seq(w.steps)
    ]
    if steps:
        Step.objects.using(using).bulk_create(
            steps,
            update_conflicts=True,
            unique_fields=["run_id", "seq"],
            update_fields=["kind", "name", "status", "result", "error", "attempts", "epoch", "completed_at"],
        )


def settled_elsewhere(batch: list[WorkflowWrites], using: str) -> set[str]:
    """The workflows of ``batch`` with a guarded step (``WorkflowWrites.guards``) that is no longer
    running at the attempt their context believes: an atomic attempt of an older context of the
    workflow (reloaded at the same epoch) committed it. Called under the fence: every writer of a
    step holds the workflow's claim lock, so what this reads cannot change before the commit. A
    guarded step with no row yet is not settled (it is written by this very commit).

    Args:
        batch: the writes whose claims this transaction has locked.
        using: the connection alias.
    """
    wanted = {(w.run_id, seq): (w.workflow_id, attempt) for w in batch for seq, attempt in w.guards.items()}
    if not wanted:
        return set()
    settled: set[str] = set()
    for chunk in backend(using).chunks(sorted(wanted), per_item=2):
        where = Q()
        for run, seq in chunk:
            where |= Q(run_id=run, seq=seq)
        rows = Step.objects.using(using).filter(where).values_list("run_id", "seq", "status", "attempts")
        settled.update(
            wanted[(str(run), seq)][0]
            for run, seq, status, attempts in rows
            if (status, attempts) != (StepStatus.RUNNING, wanted[(str(run), seq)][1])
        )
    return settled


def _with_active_children(workflow_ids: list[str], using: str) -> set[str]:
    """Which of these runs have active children (one query for the whole batch, one per chunk past the
    database's parameter limit)."""
    runs = Workflow.objects.using(using).filter(status__in=list(ACTIVE_STATUSES))
    return {
        parent
        for chunk in backend(using).chunks(workflow_ids)
        for parent in runs.filter(parent_id__in=chunk).values_list("parent_id", flat=True)
        if parent is not None
    }


# -- messages -------------------------------------------------------------------------------------


def apply_messages(batch: list[WorkflowWrites], now: datetime, using: str) -> None:
    """Write the message parts of these workflows' writes (inside their fenced transaction).

    An admitted update is settled only if it is still admitted: the caller's timeout writes
    ``expired`` with the mirror condition, so exactly one of the two lands. A respond() answer lands
    only while its update is still accepted (a repeat after a takeover is a no-op).

    Raises:
        UpdateRaceLost: an update was no longer admitted (the whole transaction rolls back: the
            handler's effects must not commit either).
    """
    answered: list[str] = []
    for w in batch:
        for done in w.updates_done:
            fields: dict[str, Any] = {"status": done.status, "result": done.result, "error": done.error}
            fields["issues"] = done.issues
            if done.status != UpdateStatus.ACCEPTED:
                fields["completed_at"] = now
                answered.append(done.update_id)
            if not mailbox.settle_update(done.update_id, w.run_id, fields, using):
                raise UpdateRaceLost(f"update {done.update_id} of workflow {w.workflow_id!r} is no longer admitted")
        for update_id, text in w.update_responses:
            if mailbox.answer_accepted(update_id, w.run_id, text, now, using):
                answered.append(update_id)
    applied = [
        AppliedUpdate(
            workflow_id=w.workflow_id,
            run_id=w.run_id,
            seq=a.seq,
            n=a.n,
            name=a.name,
            payload=a.payload,
            result=a.result,
            error=a.error,
            update_id=a.update_id,
        )
        for w in batch
        for a in w.applied
    ]
    if applied:
        AppliedUpdate.objects.using(using).bulk_create(applied)
    if answered:
        send_many("a", answered, using)  # callers waiting in update() re-read their row


def fenced_messages(
    engine_id: str,
    epochs: dict[str, int],
    build: Callable[[set[str]], list[WorkflowWrites]],
    now: datetime,
    using: str,
) -> FenceResult:
    """A fenced commit whose writes are computed inside the transaction, after the fence is taken:
    ``build`` receives the workflows still held at their epochs and returns their writes (steps and
    message parts only). engine/messages.py locks the admitted updates and runs their handlers there,
    so a handler runs only where its outcome can commit, and a takeover waits for the commit.

    Raises:
        UpdateRaceLost: a settled update was no longer admitted (nothing committed).
    """
    with fenced(epochs, using, holder=(engine_id, epochs), wait=False) as fence:
        sessions.allow_user_code(using)  # build() runs update handlers
        held = fence.held
        batch = [w for w in build(held) if w.workflow_id in held and not w.empty] if held else []
        write_steps(batch, now, using)
        apply_messages(batch, now, using)
        visibility.write_batch(batch, using)
    lost, busy = claims.classify_unheld(engine_id, {wid: e for wid, e in epochs.items() if wid not in held}, using)
    return FenceResult(held, lost, busy=busy)
