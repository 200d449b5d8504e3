"""External state transitions: cancel, suspend, resume, retry, time out and purge.

Besides the engine's fenced commits, this module is the only code that changes a workflow's status.
Any process may commit these transitions. Each one runs in one transaction on the WEFT database
and takes its locks in the global order claim -> workflow -> steps / timers / signals / updates.
It draws a new epoch for the claim and clears the holder in the same transaction, which deposes an
engine that is still driving the run: that engine's next fenced commit finds another epoch and
writes nothing. Wake-ups are sent in the transaction, so engines and result() callers see them only
once it commits.

Inside a caller's ``transaction.atomic()`` a transition joins that transaction and takes effect when
it commits. A deadlock or serialization failure is retried a few times when the transition owns the
transaction. Inside a caller's transaction it is raised, because only the caller can retry the whole
transaction.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.db import DatabaseError, connections
from django.db.models import QuerySet

from . import conf, events
from .exceptions import UnknownQueueError, WorkflowNotFoundError, WorkflowStateError, WorkflowTerminalError
from .models import (
    IdempotencyKey,
    QueryRequest,
    Step,
    Timer,
    Workflow,
    WorkflowClaim,
)
from .status import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    ParentClosePolicy,
    WorkflowStatus,
)
from .store import claims, mailbox, maintenance, notify, runs, sessions
from .store.backend import backend

# moved to weft_django.store.claims (issue 15): re-export until callers move
from .store.claims import active_descendants, rotate_epoch, write_claim  # noqa: F401
from .store.clock import db_now
from .store.commit import fenced

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_ATTEMPTS = 5
PURGE_BATCH_SIZE = 500
_RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure
_WORKFLOW_FIELDS = (
    "id",
    "run_id",
    "status",
    "workflow_type",
    "parent_id",
    "parent_run_id",
    "parent_seq",
    "error",
    "queue",
)
# Rows that belong to a run and go with it (Workflow itself and its claim are handled separately).
_RUN_TABLES = maintenance.RUN_TABLES


def _alias(using: str | None) -> str:
    if using:
        return using
    from .conf import database_alias

    return database_alias()


def is_retryable(error: DatabaseError) -> bool:
    """Whether a failed transaction may be run again as it is: a deadlock or a serialization failure
    (PostgreSQL), or SQLite's busy timeout."""
    if getattr(error.__cause__, "sqlstate", None) in _RETRYABLE_SQLSTATES:
        return True
    return sessions.write_lock_busy(error)  # SQLite, when a writer outlasts the busy timeout


def run_in_transaction(using: str, body: Callable[[], T], *, lock: Iterable[str] = (), family: bool = False) -> T:
    """Run ``body`` in the fenced transaction of ``store.commit.fenced`` (the one boundary for
    workflow-scoped writes): the claims of ``lock`` (and, with ``family``, of their active
    descendants) are locked sorted, in one statement, before ``body`` writes anything. Deadlocks and
    serialization failures are retried when this call owns the transaction.

    Args:
        using: the connection alias.
        body: the transition's reads and writes.
        lock: the workflows whose claims the transition changes.
        family: also lock the active descendants' claims (a run that ends closes its children).

    Raises:
        django.db.DatabaseError: the transaction failed (after the retries, when they apply).
    """

    def attempt() -> T:
        with fenced(list(lock), using, family=family):
            return body()

    return retried(using, attempt)


def retried(using: str, attempt: Callable[[], T]) -> T:
    """Run ``attempt`` (one whole transaction) and, when this call owns the transaction (not inside a
    caller's atomic block), run it again after a deadlock or serialization failure, with back-off.

    Args:
        using: the connection alias.
        attempt: opens, runs and commits the transaction.

    Raises:
        django.db.DatabaseError: the transaction failed (after the retries, when they apply).
    """
    owns_transaction = not connections[using].in_atomic_block
    for number in range(1, MAX_ATTEMPTS + 1):
        try:
            return attempt()
        except DatabaseError as exc:
            if not owns_transaction or number == MAX_ATTEMPTS or not is_retryable(exc):
                raise
            delay = random.uniform(0.01, 0.05) * 2**number
            logger.info("weft transaction retried after %s (attempt=%s delay=%.3fs)", exc, number, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def lock_workflow(workflow_id: str, using: str) -> dict[str, Any] | None:
    """Lock the claim row, then the workflow row (the global lock order); return the workflow's
    id, run_id, status, workflow_type, parent_id and error, or None when there is no such workflow."""
    claims.lock_claim(workflow_id, using)
    return Workflow.objects.using(using).select_for_update().filter(pk=workflow_id).values(*_WORKFLOW_FIELDS).first()


def _lock(workflow_id: str, using: str, run_id: str | None = None) -> dict[str, Any]:
    """Lock the workflow (claim, then row). With ``run_id``, the run the caller saw (an admin page): a
    WorkflowStateError, under the lock and before any write, when another run is current now."""
    row = lock_workflow(workflow_id, using)
    if row is None:
        raise WorkflowNotFoundError(
            f'No workflow "{workflow_id}" exists (it was never started, or it was purged). Check the id.'
        )
    if run_id is not None and str(row["run_id"]) != str(run_id):
        raise WorkflowStateError(
            f'Workflow "{workflow_id}" was not changed: run {run_id}, the one this was meant for, has ended '
            f"(continued as new, or started again), and run {row['run_id']} ({row['status']}) is current now. "
            f"Look at the current run first, then act again if it still applies."
        )
    return row


def delete_run_rows(workflow_ids: list[str], using: str) -> None:
    """Delete the steps, timers, signals, updates and applied updates of these workflows."""
    for chunk in backend(using).chunks(workflow_ids):  # a purge's batch: its size is the caller's
        for model in _RUN_TABLES:
            model.objects.using(using).filter(workflow_id__in=chunk).delete()


def _end_run(row: dict[str, Any], status: WorkflowStatus, using: str, *, reason: str | None = None) -> int:
    """Make the locked, active run terminal from outside; return the claim's new epoch."""
    workflow_id = row["id"]
    now = db_now(using)
    fields: dict[str, Any] = {"status": status, "finished_at": now, "updated_at": now, "stuck_retry_at": None}
    if status == WorkflowStatus.CANCELLED:
        fields["cancel_reason"] = reason
    Workflow.objects.using(using).filter(pk=workflow_id).update(**fields)
    epoch = rotate_epoch(workflow_id, using, runnable=False)
    error = {
        "type": "WorkflowTerminalError",
        "message": f'Workflow "{workflow_id}" was {status} before this update was applied.',
    }
    taken = f'Workflow "{workflow_id}" was {status} after its wait_for_update took this update, before it answered.'
    taken_error = {"type": "WorkflowTerminalError", "message": taken, "accepted": True}
    mailbox.close_mailboxes([workflow_id], now, using, error=error, taken_error=taken_error)
    Timer.objects.using(using).filter(workflow_id=workflow_id).delete()
    _close_children(row, status, using)
    events.workflow_ended(row, status, reason, using)  # the signal waits for this transaction's commit
    if row["parent_id"] and row["parent_seq"] is not None:
        error_type = "WorkflowCancelledError" if status == WorkflowStatus.CANCELLED else "WorkflowTimedOutError"
        mailbox.report_child_end(  # the parent's owner learns that its child ended (and is woken)
            row["id"],
            row["parent_id"],
            str(row["parent_run_id"]),
            row["parent_seq"],
            status,
            None,
            {"type": error_type, "message": reason or f"the child workflow was {status}"},
            now,
            using,
        )
    notify.send("w", workflow_id, using)
    notify.send("r", workflow_id, using)
    return epoch


def close_children(parent_id: str, parent_run_id: str, status: str, using: str) -> None:
    """Apply parent_close_policy to the active children of a run that just ended (engine terminal commit)."""
    _close_children({"id": parent_id, "run_id": parent_run_id}, status, using)


def _close_children(row: dict[str, Any], status: str, using: str) -> None:
    """Apply each active child's parent_close_policy: terminate and request_cancel cancel it."""
    children = (
        Workflow.objects.using(using)
        .filter(parent_id=row["id"], parent_run_id=row["run_id"], status__in=ACTIVE_STATUSES)
        .exclude(parent_close_policy=ParentClosePolicy.ABANDON)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    for child_id in list(children):
        try:
            child = _lock(child_id, using)
            if child["status"] in TERMINAL_STATUSES:
                continue  # it ended meanwhile
            _end_run(child, WorkflowStatus.CANCELLED, using, reason=f'parent workflow "{row["id"]}" was {status}')
        except WorkflowNotFoundError:
            continue  # purged meanwhile


def cancel(workflow_id: str, reason: str | None = None, *, using: str | None = None, run_id: str | None = None) -> int:
    """Cancel an active run: cancelled, holder deposed, mailbox closed, timers deleted, children
    closed per their parent_close_policy. Returns the claim's new epoch.

    Raises WorkflowTerminalError when the run already ended, WorkflowNotFoundError for an unknown id,
    WorkflowStateError when ``run_id`` (the run the caller saw) is given and another run is current.
    """
    alias = _alias(using)

    def body() -> int:
        row = _lock(workflow_id, alias, run_id)
        if row["status"] in TERMINAL_STATUSES:
            raise WorkflowTerminalError(
                f'Workflow "{workflow_id}" already ended ({row["status"]}); there is nothing to cancel.'
            )
        return _end_run(row, WorkflowStatus.CANCELLED, alias, reason=reason)

    return run_in_transaction(alias, body, lock=[workflow_id], family=True)


def cancel_active(workflow_ids: Iterable[str], reason: str | None, *, using: str) -> list[str]:
    """Cancel those of ``workflow_ids`` that are still active, in one fenced transaction: their claims
    and their active descendants' are locked sorted by workflow id, in one statement, before any
    write (a schedule's overlap="cancel_running" ends several runs at once; one ``cancel`` per run
    would lock them one at a time). Runs that ended or were purged meanwhile are passed over.

    Args:
        workflow_ids: the runs to end.
        reason: the cancel reason recorded on each.
        using: the connection alias.

    Returns:
        The ids cancelled, sorted.
    """
    ids = sorted(set(workflow_ids))

    def body() -> list[str]:
        rows = {
            row["id"]: row
            for row in Workflow.objects.using(using).select_for_update().filter(pk__in=ids).values(*_WORKFLOW_FIELDS)
        }
        ended = []
        for workflow_id in ids:
            row = rows.get(workflow_id)
            if row is None or row["status"] in TERMINAL_STATUSES:
                continue
            _end_run(row, WorkflowStatus.CANCELLED, using, reason=reason)
            ended.append(workflow_id)
        return ended

    return run_in_transaction(using, body, lock=ids, family=True) if ids else []


def time_out(workflow_id: str, *, using: str | None = None, run_id: str | None = None) -> int:
    """End an active run as timed_out (its execution deadline passed); otherwise as ``cancel``."""
    alias = _alias(using)

    def body() -> int:
        row = _lock(workflow_id, alias, run_id)
        if row["status"] in TERMINAL_STATUSES:
            raise WorkflowTerminalError(
                f'Workflow "{workflow_id}" already ended ({row["status"]}); it cannot time out.'
            )
        return _end_run(row, WorkflowStatus.TIMED_OUT, alias)

    return run_in_transaction(alias, body, lock=[workflow_id], family=True)


_PAST = {"suspend": "suspended", "resume": "resumed", "retry": "retried"}


def _state_error(workflow_id: str, action: str, required: str, status: str) -> WorkflowStateError:
    message = (
        f'Cannot {action} workflow "{workflow_id}": only a {required} workflow can be {_PAST[action]}, '
        f"and it is {status}"
    )
    if action == "suspend" and status == WorkflowStatus.PENDING:
        message += " (it has not started yet: cancel it, or suspend it once it runs)"
    elif action == "retry" and status in TERMINAL_STATUSES:
        message += ' (start a new run with on_conflict="start_new" instead)'
    elif action == "retry":
        message += " (it has not failed)"
    return WorkflowStateError(message + ".")


def _set_running_status(
    workflow_id: str,
    *,
    action: str,
    required: str,
    new_status: WorkflowStatus,
    using: str | None,
    run_id: str | None = None,
    extra: Callable[[dict[str, Any], str], dict[str, Any]] | None = None,
) -> int:
    alias = _alias(using)

    def body() -> int:
        row = _lock(workflow_id, alias, run_id)
        if row["status"] != required:
            raise _state_error(workflow_id, action, required, row["status"])
        fields: dict[str, Any] = {"status": new_status, "updated_at": db_now(alias)}
        if extra is not None:
            fields.update(extra(row, alias))
        Workflow.objects.using(alias).filter(pk=workflow_id).update(**fields)
        # suspend: no engine may take it; resume and retry: claimable again at once (a retry in a
        # queue: pending, claimable once admitted).
        epoch = rotate_epoch(workflow_id, alias, runnable=fields["status"] == WorkflowStatus.RUNNING)
        notify.send("w", workflow_id, alias)
        return epoch

    return run_in_transaction(alias, body, lock=[workflow_id])


def suspend(workflow_id: str, *, using: str | None = None, run_id: str | None = None) -> int:
    """running -> suspended. The owner is deposed and no engine picks the run up until it is resumed;
    its timers stay. Returns the claim's new epoch. Else WorkflowStateError saying why (also when
    ``run_id``, the run the caller saw, is given and another run is current)."""
    return _set_running_status(
        workflow_id,
        action="suspend",
        required=WorkflowStatus.RUNNING,
        new_status=WorkflowStatus.SUSPENDED,
        using=using,
        run_id=run_id,
    )


def resume(workflow_id: str, *, using: str | None = None, run_id: str | None = None) -> int:
    """suspended -> running with no holder: an engine claims it. The execution deadline is absolute
    and not extended. Returns the claim's new epoch. Else WorkflowStateError saying why (also when
    ``run_id``, the run the caller saw, is given and another run is current)."""
    return _set_running_status(
        workflow_id,
        action="resume",
        required=WorkflowStatus.SUSPENDED,
        new_status=WorkflowStatus.RUNNING,
        using=using,
        run_id=run_id,
    )


def _failing_step_seq(row: dict[str, Any], using: str) -> int | None:
    """The seq of the step that ended the failed run (the engine names it in the run's error as
    ``"seq"``), or None when the workflow's own code raised: then no step is removed."""
    error = row["error"] if isinstance(row["error"], dict) else {}
    named = error.get("seq")
    if isinstance(named, int) and not isinstance(named, bool):
        return named
    return None


def _retry_fields(row: dict[str, Any], using: str) -> dict[str, Any]:
    queue = row["queue"]
    if queue is not None and queue not in conf.queues():
        known = ", ".join(sorted(conf.queues())) or "none"
        raise UnknownQueueError(
            f'Workflow "{row["id"]}" ran in queue "{queue}", which is no longer in WEFT["QUEUES"] (defined: '
            f"{known}): a retried run waits there for its admission. Add the queue back, then retry it."
        )
    seq = _failing_step_seq(row, using)
    if seq is not None:
        Step.objects.using(using).filter(run_id=row["run_id"], seq=seq).delete()
        mailbox.forget_child_end(row["run_id"], seq, using)  # a child step: its child's end is told again
    mailbox.redeliver_child_ends(row["run_id"], using)  # a child step still waiting: its child's end again
    # A run in a queue re-enters it like a new start: pending until an engine admits it, which sets
    # its execution deadline from its execution_timeout again (store/queues.py admit).
    queued = {"status": WorkflowStatus.PENDING, "admitted_at": None, "started_at": None, "execution_deadline": None}
    return {
        **(queued if queue is not None else {}),
        "error": None,
        "result": None,
        "finished_at": None,
        "stuck_error": None,
        "stuck_retry_at": None,
        "stuck_attempts": 0,
    }


def retry(workflow_id: str, *, using: str | None = None, run_id: str | None = None) -> int:
    """failed -> running, same run_id: the failing step is removed so it runs again with a fresh
    attempt count; signals and updates closed at the failure stay closed, not the ends of its children
    (a child step still waiting gets its child's end). A run in a queue goes back
    to it: pending (same queue, priority and concurrency key) until an engine admits it within the
    queue's limits. Returns the new epoch.

    Raises:
        UnknownQueueError: the run's queue is no longer in WEFT["QUEUES"] (nothing changed).
        WorkflowStateError: not failed, or ``run_id`` (the run the caller saw) is not the current run.
    """
    return _set_running_status(
        workflow_id,
        action="retry",
        required=WorkflowStatus.FAILED,
        new_status=WorkflowStatus.RUNNING,
        using=using,
        run_id=run_id,
        extra=_retry_fields,
    )


def purge(
    workflows: str | Iterable[str] | QuerySet[Workflow],
    *,
    using: str | None = None,
    batch_size: int = PURGE_BATCH_SIZE,
    wait: bool = True,
) -> int:
    """Delete terminal workflows and every row they own; return how many were deleted.

    ``workflows`` is one id, an iterable of ids, or a ``Workflow`` queryset (e.g. a retention
    filter). Unknown ids are ignored. If any selected workflow is not terminal, WorkflowStateError is
    raised before anything is deleted. Idempotency keys of purged runs are kept and marked purged, so
    a reused key says so. Each batch of ``batch_size`` is its own transaction (unless the call runs
    inside the caller's). ``wait=False`` (the engine's retention sweep, on its loop): a run whose claim
    or row another transaction holds is left as it is (a later pass purges it), never waited for.
    """
    alias = _alias(using)
    if isinstance(workflows, QuerySet):
        queryset = workflows.using(alias)
        _refuse_active(queryset.exclude(status__in=TERMINAL_STATUSES).values_list("pk", flat=True)[:10])
        purged, after = 0, None
        while True:
            terminal = queryset.filter(status__in=TERMINAL_STATUSES)
            if after is not None:  # keyset: a batch whose rows changed meanwhile is passed, not read again
                terminal = terminal.filter(pk__gt=after)
            batch = list(terminal.order_by("pk").values_list("pk", flat=True)[:batch_size])
            if not batch:
                return purged
            after = batch[-1]

            # The queryset's conditions are checked again under the claims' lock: a run started again
            # (start_new) since the batch was read is not the run the queryset selected.
            def matching(ids: list[str]) -> set[str]:
                return {
                    wid
                    for chunk in backend(alias).chunks(ids)
                    for wid in queryset.filter(pk__in=chunk).values_list("pk", flat=True)
                }

            purged += run_in_transaction(
                alias, functools.partial(_purge_batch, batch, alias, matching=matching, wait=wait)
            )
    ids = sorted({workflows} if isinstance(workflows, str) else set(workflows))
    batches = [ids[start : start + batch_size] for start in range(0, len(ids), batch_size)]
    active: list[str] = []
    for chunk in backend(alias).chunks(ids):
        active += (
            Workflow.objects.using(alias)
            .filter(pk__in=chunk)
            .exclude(status__in=TERMINAL_STATUSES)
            .values_list("pk", flat=True)[: 10 - len(active)]
        )
        if len(active) >= 10:
            break
    _refuse_active(active)
    return sum(run_in_transaction(alias, functools.partial(_purge_batch, batch, alias, wait=wait)) for batch in batches)


def purge_terminal(
    workflow_ids: list[str],
    *,
    using: str | None = None,
    matching: Callable[[list[str]], set[str]] | None = None,
) -> int:
    """Purge those of these workflows that are terminal when the purge's fenced transaction locks
    them, skipping the others (a bulk purge's batch: one that became active meanwhile is left as it
    is). ``matching``, called under the lock with the ids, returns those still selected (a run started
    again since the batch was read is left). Returns how many were deleted."""
    alias = _alias(using)
    return run_in_transaction(
        alias, functools.partial(_purge_batch, sorted(set(workflow_ids)), alias, matching=matching)
    )


def _refuse_active(active_ids: Iterable[str]) -> None:
    found = list(active_ids)
    if found:
        shown = ", ".join(f'"{i}"' for i in found)
        raise WorkflowStateError(
            f"Only finished workflows can be purged, and these are still active: {shown}. Cancel them "
            f"first, or leave them out."
        )


def _purge_batch(
    ids: list[str], using: str, *, matching: Callable[[list[str]], set[str]] | None = None, wait: bool = True
) -> int:
    # A batch is as long as the caller's ``batch_size`` (or list): each statement over its ids goes in
    # chunks past the database's parameter limit (``Backend.chunks``), in this one transaction.
    found = backend(using)
    locked = claims.lock_ids(sorted(ids), using, wait=wait)
    if not wait:  # those whose claim another transaction holds are left (a run with no claim row is not)
        claim_rows = WorkflowClaim.objects.using(using)
        having = {
            wid for chunk in found.chunks(ids) for wid in claim_rows.filter(pk__in=chunk).values_list("pk", flat=True)
        }
        ids = sorted(locked | (set(ids) - having))
    if matching is not None:
        ids = sorted(matching(ids))
    terminal = (
        Workflow.objects.using(using)
        .select_for_update(skip_locked=not wait and found.skips_locked)
        .filter(status__in=TERMINAL_STATUSES)
        .order_by("pk")
    )
    rows = [
        row for chunk in found.chunks(ids) for row in terminal.filter(pk__in=chunk).values_list("pk", "idempotency_key")
    ]
    if not rows:
        return 0
    if wait or not found.bounds_sessions:
        return _delete_runs(rows, using)
    # The retention sweep, on the engine's loop: a row of these runs (a step, a signal...) that another
    # transaction holds must not keep the loop waiting for lock_timeout, nor the batch's other runs from
    # going. Nothing held (the usual case): one bounded try. Else the runs with a held row are left.
    try:
        with sessions.lock_wait_bounded(using):
            return _delete_runs(rows, using)
    except DatabaseError as exc:
        if not sessions.lock_wait_ended(exc):
            raise
    held = maintenance.held_elsewhere([pk for pk, _ in rows], {key: pk for pk, key in rows if key}, using)
    with sessions.lock_wait_bounded(using):  # the others' rows are locked now
        return _delete_runs([row for row in rows if row[0] not in held], using)


def _delete_runs(rows: list[tuple[str, str | None]], using: str) -> int:
    """Delete these locked terminal runs ((id, idempotency key)) and every row they own; mark their
    idempotency keys purged. Returns how many."""
    found, purged = backend(using), [pk for pk, _ in rows]
    keys = sorted({key for _, key in rows if key})
    if keys:  # the keys of these runs that still name one of them
        now, ours = db_now(using), set(purged)
        unpurged = IdempotencyKey.objects.using(using).filter(purged_at__isnull=True)
        for chunk in found.chunks(keys):
            found_keys = unpurged.filter(key__in=chunk).values_list("key", "workflow_id")
            named = [key for key, wid in found_keys if wid in ours]
            if named:
                unpurged.filter(key__in=named).update(purged_at=now)
    delete_run_rows(purged, using)
    for chunk in found.chunks(purged):
        QueryRequest.objects.using(using).filter(workflow_id__in=chunk).delete()
    claims.delete_claims(purged, using)
    runs.delete_workflows(purged, using)
    return len(purged)


__all__ = [
    "cancel",
    "delete_run_rows",
    "lock_workflow",
    "purge",
    "purge_terminal",
    "resume",
    "retry",
    "rotate_epoch",
    "run_in_transaction",
    "suspend",
    "time_out",
    "write_claim",
]
