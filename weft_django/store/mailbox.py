"""The mailbox: buffered signals and pending updates (insert, consume, settle, close, drop)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, Subquery, Value

from ..codec import encode
from ..models import BufferedSignal, ContinuedRun, PendingUpdate, QueryRequest, Timer, Workflow, WorkflowClaim
from ..status import ACTIVE_STATUSES, QueryStatus, SignalState, UpdateStatus, WorkflowStatus
from ..validation import CHILD_MAILBOX_PREFIX
from . import damaged_rows, notify, prepared
from .backend import backend
from .clock import db_now, workflow_now_sql
from .sessions import write_unlocked

# -- client side (start, handles, transitions, schedules, testing) --------------------------

ENDED_BEFORE_APPLIED = {"type": "WorkflowTerminalError", "message": "The workflow ended before the update was applied."}
# The columns of a signal's S: wake-up, in notify.BufferedRow's order.
_CARRIED = "id, workflow_id, run_id, name, payload, trace_context"
_ACTIVE = [str(status.value) for status in (WorkflowStatus.PENDING, WorkflowStatus.RUNNING, WorkflowStatus.SUSPENDED)]


# An update a wait_for_update took (accepted) was consumed, not left unapplied: its caller is told so.
TAKEN_ERROR = {
    "type": "WorkflowTerminalError",
    "message": "The workflow took the update (wait_for_update) but ended before it answered it (no respond()).",
    "accepted": True,
}


def close_mailboxes(
    workflow_ids: list[str],
    now: datetime,
    using: str,
    *,
    error: Mapping[str, Any] | None = None,
    taken_error: Mapping[str, Any] | None = None,
) -> None:
    """Close the mailbox of these runs (they ended): unconsumed signals are dropped, admitted and
    accepted updates fail, as nothing will ever handle them now. In the caller's transaction.

    Args:
        workflow_ids: the runs that ended.
        now: workflow time, the updates' completed_at.
        using: the connection alias.
        error: the error of updates never taken (default ``ENDED_BEFORE_APPLIED``).
        taken_error: the error of updates a ``wait_for_update`` took but never answered (default
            ``TAKEN_ERROR``; it carries ``"accepted": True`` so the caller hears the update was consumed).
    """
    for chunk in backend(using).chunks(workflow_ids):  # past the database's parameter limit: in chunks
        BufferedSignal.objects.using(using).filter(workflow_id__in=chunk, state=SignalState.BUFFERED).update(
            state=SignalState.DROPPED
        )
        PendingUpdate.objects.using(using).filter(workflow_id__in=chunk, status=UpdateStatus.ACCEPTED).update(
            status=UpdateStatus.FAILED, error=dict(taken_error or TAKEN_ERROR), completed_at=now
        )
        PendingUpdate.objects.using(using).filter(workflow_id__in=chunk, status=UpdateStatus.ADMITTED).update(
            status=UpdateStatus.FAILED, error=dict(error or ENDED_BEFORE_APPLIED), completed_at=now
        )


def buffer_signal(
    workflow_id: str, name: str, text: str, signal_id: str | None, using: str, trace_context: str | None = None
) -> bool:
    """Append a signal to the current run's mailbox while that run is active, and send the wake-up.

    On PostgreSQL one statement, the NOTIFY riding in it (delivered when it, or the caller's
    transaction, commits); elsewhere engines poll. No lock on the claim: a slow caller must never
    stall renewal. Returns whether a row was inserted (False: no active run, or a repeated
    ``signal_id`` of this run). ``trace_context``: the sender's (``weft_django.tracing``)."""
    store = backend(using)
    connection = store.connection
    signals, workflows = BufferedSignal._meta.db_table, Workflow._meta.db_table
    if store.writes_in_one_statement:
        now_sql, now_params = workflow_now_sql("postgresql"), []
    else:
        now_sql, now_params = "%s", [connection.ops.adapt_datetimefield_value(db_now(using))]
    # Table names are the models' own; every value is a parameter.
    insert = (
        f"INSERT INTO {signals} (workflow_id, run_id, name, signal_id, payload, state, trace_context, created_at) "
        f"SELECT w.id, w.run_id, %s, %s, %s, %s, %s, {now_sql} FROM {workflows} w "
        f"WHERE w.id = %s AND w.status IN (%s, %s, %s) ON CONFLICT DO NOTHING"
    )
    params = [name, signal_id, text, str(SignalState.BUFFERED.value), trace_context, *now_params, workflow_id, *_ACTIVE]
    with connection.cursor() as cursor:
        if store.writes_in_one_statement:
            wake = f"w:{workflow_id}" if len(workflow_id) < notify.MAX_PAYLOAD - 2 else "w:*"
            # The wake-up carries the row (S:, store/notify.py) when it fits, else names the workflow.
            prepared.execute(
                cursor,
                connection,
                f"WITH s AS ({insert} RETURNING {_CARRIED}), j AS (SELECT json_build_array({_CARRIED})::text AS t "
                "FROM s) SELECT pg_notify(%s, CASE WHEN octet_length(t) <= %s THEN 'S:' || t ELSE %s END) FROM j",
                [*params, notify.CHANNEL, notify.MAX_CARRIED_SIGNAL - 2, wake],
            )
            return len(cursor.fetchall()) == 1
        cursor.execute(insert, params)
        return bool(cursor.rowcount == 1)


def why_not_buffered(workflow_id: str, signal_id: str | None, using: str) -> tuple[str | None, bool]:
    """After ``buffer_signal`` inserted nothing: the workflow's status now (None: no such workflow),
    and whether ``signal_id`` is already in its current run's mailbox (a repeated signal). An active
    run with no such signal means the run became active after the insert's snapshot (a start, a
    retry): the caller inserts again."""
    same = BufferedSignal.objects.using(using).filter(run_id=OuterRef("run_id"), signal_id=signal_id)
    row = (
        Workflow.objects.using(using)
        .filter(pk=workflow_id)
        .annotate(repeated=Exists(same) if signal_id is not None else Value(False))
        .values_list("status", "repeated")
        .first()
    )
    return (None, False) if row is None else (row[0], bool(row[1]))


def child_mailbox_name(seq: int) -> str:
    """The reserved signal name under which a child reports to its parent's step ``seq``."""
    return f"{CHILD_MAILBOX_PREFIX}{seq}"


def child_record_id(seq: int, child_id: str) -> str:
    """The signal id of child ``child_id``'s end record at its parent's step ``seq``: one record per
    child and step, not per step. A step whose child changed (a parent retried under new code gives it
    another id, while the old child, retried too, still reports there) must keep a place for its own
    child's end; the old one's record is taken out of the way (engine/owned.ends_its_child)."""
    return f"{child_mailbox_name(seq)}:{child_id}"


def forget_child_end(run_id: Any, seq: int, using: str) -> None:
    """Delete the records of the end of the children started at step ``seq`` of run ``run_id``, whatever
    their state (a retry removed that step: the child's end, reported again, must find its place free).

    Args:
        run_id: the parent run; ``seq``: the child step; ``using``: the connection alias.
    """
    name = child_mailbox_name(seq)
    BufferedSignal.objects.using(using).filter(run_id=run_id, name=name).delete()


def redeliver_child_ends(run_id: Any, using: str) -> None:
    """A failed run retried (same run id): the ends of its children that its mailbox closed unconsumed
    (its terminal commit, or the message cleanup as late mail, dropped them) are buffered again. A child
    step still waiting when the run failed (another step failed) waits again after the retry, and its
    child's end, written once, is the only thing that settles it. A record no step waits for is
    dropped again at the run's end. In the retry's transaction (the workflow's row locked).

    Args:
        run_id: the retried run; ``using``: the connection alias.
    """
    BufferedSignal.objects.using(using).filter(
        run_id=run_id, signal_id__startswith=CHILD_MAILBOX_PREFIX, state=SignalState.DROPPED
    ).update(state=SignalState.BUFFERED)


class ChildEnd(NamedTuple):
    """A child's end for its parent's mailbox: the child, the parent run and the step that waits for
    it, and how it ended (``result_text`` codec text, ``error`` its error dict)."""

    child_id: str
    parent_id: str
    parent_run_id: str
    parent_seq: int
    status: str
    result_text: str | None
    error: dict[str, Any] | None


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
    """Write the child-terminal record into the parent's mailbox and wake the parent's engine: a
    buffered signal under the reserved name of the step ``parent_seq``, written once per child and step
    (its reserved id, ``child_record_id``).

    Args:
        child_id: the child that ended; ``status``, ``result_text`` (codec text) and ``error`` its end.
        parent_id, parent_run_id, parent_seq: the parent run and the step that waits for the child.
        now: workflow time (the signal's created_at).
        using: the connection alias, in the caller's transaction.
    """
    report_child_ends(
        [ChildEnd(child_id, parent_id, parent_run_id, parent_seq, status, result_text, error)], now, using
    )


def report_child_ends(ends: list[ChildEnd], now: datetime, using: str) -> None:
    """``report_child_end`` for many children at once (the ends of one fenced commit): one insert per
    chunk of rows the database can bind and one statement of wake-ups, in the caller's transaction,
    instead of two statements per child. Nothing for an empty list.

    Args:
        ends: the children's ends; ``now``: workflow time; ``using``: the connection alias.
    """
    if not ends:
        return
    rows = [
        BufferedSignal(
            workflow_id=end.parent_id,
            run_id=end.parent_run_id,
            name=child_mailbox_name(end.parent_seq),
            signal_id=child_record_id(end.parent_seq, end.child_id),
            payload=encode(
                {"child_id": end.child_id, "status": end.status, "result": end.result_text, "error": end.error}
            ),
            created_at=now,
        )
        for end in sorted(ends, key=lambda end: (end.parent_id, end.parent_seq, end.child_id))
    ]
    for chunk in backend(using).chunks(rows, per_item=len(BufferedSignal._meta.concrete_fields)):
        BufferedSignal.objects.using(using).bulk_create(chunk, ignore_conflicts=True)
    notify.send_many("w", sorted({end.parent_id for end in ends}), using)


def ask_query(
    request_id: str,
    workflow_id: str,
    engine_id: str,
    name: str,
    arg_text: str | None,
    has_arg: bool,
    now: datetime,
    deadline: datetime,
    using: str,
) -> None:
    """Write a query request for the engine that holds the run and wake that engine, in one
    transaction whose commit does not wait for the disk (a lost request is asked again)."""
    with transaction.atomic(using=using):
        backend(using).relax_commit()
        QueryRequest.objects.using(using).create(
            id=request_id,
            workflow_id=workflow_id,
            engine_id=engine_id,
            name=name,
            arg=arg_text,
            has_arg=has_arg,
            created_at=now,
            deadline=deadline,
        )
        notify.send("q", engine_id, using)


def admit_update(
    workflow_id: str,
    run_id: Any,
    name: str,
    text: str,
    key: str | None,
    now: datetime,
    deadline: datetime,
    using: str,
    trace_context: str | None = None,
    update_id: Any = None,
) -> str:
    """Insert an admitted update into run ``run_id``'s mailbox and wake its engine; return its id
    (``update_id`` when given, else a new one). IntegrityError when the run already has an update
    with idempotency key ``key``."""
    admitted = PendingUpdate.objects.using(using).create(
        **({} if update_id is None else {"id": update_id}),
        workflow_id=workflow_id,
        run_id=run_id,
        name=name,
        payload=text,
        idempotency_key=key,
        created_at=now,
        deadline=deadline,
        trace_context=trace_context,
    )
    notify.send("w", workflow_id, using)
    return str(admitted.id)


def readmit_update(
    workflow_id: str,
    update_id: Any,
    text: str,
    now: datetime,
    deadline: datetime,
    using: str,
    trace_context: str | None = None,
) -> None:
    """Admit an expired update again (a retry with its idempotency key) and wake the run's engine;
    ``trace_context``: the retry's sender's (``weft_django.tracing``)."""
    PendingUpdate.objects.using(using).filter(pk=update_id, status=UpdateStatus.EXPIRED).update(
        trace_context=trace_context,
        status=UpdateStatus.ADMITTED,
        payload=text,
        created_at=now,
        completed_at=None,
        deadline=deadline,
        result=None,
        error=None,
        issues=None,
    )
    notify.send("w", workflow_id, using)


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------

SIGNAL_TABLE = BufferedSignal._meta.db_table
UPDATE_TABLE = PendingUpdate._meta.db_table
# Written into SQL, not a parameter: a prepared statement's generic plan can then use the partial
# index on buffered signals (weft_signal_buffered).
BUFFERED_STATE_SQL = f"state = '{SignalState.BUFFERED.value}'"
TERMINAL_ERROR = ENDED_BEFORE_APPLIED
TERMINAL_ERROR_JSON = json.dumps(TERMINAL_ERROR)
TAKEN_ERROR_JSON = json.dumps(TAKEN_ERROR)
CLEANUP_BATCH = 1000


def consume_signals(consumed: Iterable[tuple[int, int]], using: str) -> None:
    """Mark these buffered signals consumed, each by the step ``seq`` that took it: (signal pk, seq)."""
    for signal_pk, seq in consumed:
        BufferedSignal.objects.using(using).filter(pk=signal_pk).update(state=SignalState.CONSUMED, consumed_seq=seq)


def close_ended(workflow_ids: list[str], now: datetime, using: str) -> None:
    """The terminal commit: the mailbox closes (``close_mailboxes`` with the terminal error), timers go."""
    close_mailboxes(workflow_ids, now, using, error=TERMINAL_ERROR)
    for chunk in backend(using).chunks(workflow_ids):
        Timer.objects.using(using).filter(workflow_id__in=chunk).delete()


def settle_update(update_id: str, run_id: str, fields: dict[str, Any], using: str) -> bool:
    """Write an admitted update's outcome, only while it is still admitted (the caller's timeout writes
    ``expired`` with the mirror condition). Returns whether it landed."""
    won = (
        PendingUpdate.objects.using(using)
        .filter(pk=update_id, run_id=run_id, status=UpdateStatus.ADMITTED)
        .update(**fields)
    )
    return bool(won == 1)


def answer_accepted(update_id: str, run_id: Any, text: str, now: datetime, using: str) -> bool:
    """Complete an accepted update with respond()'s answer, only while it is still accepted and on
    ``run_id``, the run that responds: a fork replays the source's wait_for_update step, update id
    included, and its respond() must not answer the source's caller."""
    return bool(
        PendingUpdate.objects.using(using)
        .filter(pk=update_id, run_id=run_id, status=UpdateStatus.ACCEPTED)
        .update(status=UpdateStatus.COMPLETED, result=text, completed_at=now)
    )


def admitted_updates(workflow_ids: list[str], using: str) -> list[tuple[Any, str, Any, str]]:
    """The admitted updates of these workflows, each workflow's in (created_at, id) order: (id, workflow
    id, run id, name). A workflow's updates are all read by one query (the chunks split workflows), so
    the database orders them; ``created_at`` is never read into Python: a hand-edited one it cannot
    convert (past year 9999) would fail the read of every workflow's updates, on every pass."""
    rows = PendingUpdate.objects.using(using).filter(status=UpdateStatus.ADMITTED).order_by("created_at", "id")
    fields = ("id", "workflow_id", "run_id", "name")
    found: list[tuple[Any, str, Any, str]] = []
    for chunk in backend(using).chunks(workflow_ids):
        try:
            found += rows.filter(workflow_id__in=chunk).values_list(*fields)
        except (ValueError, TypeError):  # a row the ORM cannot convert (SQLite: any text in a uuid column)
            for wid in chunk:  # read again one workflow at a time: what raises names its row and workflow
                found += damaged_rows.admitted_of(rows.filter(workflow_id=wid), fields, wid)  # (containment.culprit)
    return found


def lock_admitted(update_ids: list[str], using: str) -> list[tuple[Any, str, str, str, str | None]]:
    """Inside the settling transaction: lock these updates while still admitted (SKIP LOCKED where
    rows are locked; SQLite's one-writer transaction holds them already), in the order of
    ``update_ids`` (each workflow's in (created_at, id) order: ``admitted_updates``; ``created_at`` is
    not read into Python, as there). Returns (id, workflow id, name, payload, trace context) rows."""
    found = backend(using)
    rows = PendingUpdate.objects.using(using).filter(status=UpdateStatus.ADMITTED)
    if found.skips_locked:
        rows = rows.select_for_update(skip_locked=True)
    locked = [
        row
        for chunk in found.chunks(update_ids)
        for row in rows.filter(pk__in=chunk)
        .order_by("created_at", "id")
        .values_list("id", "workflow_id", "name", "payload", "trace_context")
    ]
    position = {str(pk): index for index, pk in enumerate(update_ids)}
    locked.sort(key=lambda row: position.get(str(row[0]), len(position)))  # the caller's order, across chunks
    return locked


def queries_waiting(engine_id: str, limit: int, using: str) -> set[str]:
    """The workflows that pending query requests to ``engine_id`` ask about (a plain read, no lock)."""
    pending = QueryRequest.objects.using(using).filter(engine_id=engine_id, status=QueryStatus.PENDING)
    return set(pending.order_by("created_at").values_list("workflow_id", flat=True)[:limit])


def take_queries(engine_id: str, limit: int, using: str) -> list[tuple[Any, str, str, str | None, bool]]:
    """Inside a transaction: take the pending query requests to ``engine_id`` (SKIP LOCKED where rows
    are locked), oldest first. Returns (id, workflow id, name, arg, has_arg) rows."""
    rows = QueryRequest.objects.using(using).filter(engine_id=engine_id, status=QueryStatus.PENDING)
    rows = rows.order_by("created_at")
    if backend(using).skips_locked:
        rows = rows.select_for_update(skip_locked=True)
    return list(rows.values_list("id", "workflow_id", "name", "arg", "has_arg")[:limit])


def answer_query(request_id: Any, fields: dict[str, Any], using: str) -> None:
    """Write a query request's answer (status, result or error)."""
    QueryRequest.objects.using(using).filter(pk=request_id).update(**fields)


def _same_run_active(using: str) -> Any:
    return Workflow.objects.using(using).filter(
        pk=OuterRef("workflow_id"), run_id=OuterRef("run_id"), status__in=list(ACTIVE_STATUSES)
    )


def to_be_carried(model: Any, key: str, using: str) -> Q:
    """The carry rule, for rows of ``model`` (signals, updates): of a run that continued as new, of a
    workflow still active, with a ``key`` its current run does not have. The sweep's carrying part
    (store/continuation.carry_late, at most 1,000 a pass) moves them to the current run; they are never
    dropped or failed as late, whenever they committed, and ``update()`` waits for the move."""
    current = Workflow.objects.using(using).filter(pk=OuterRef("workflow_id"), status__in=list(ACTIVE_STATUSES))
    on_current = model.objects.using(using).filter(
        workflow_id=OuterRef("workflow_id"), run_id=Subquery(current.values("run_id")[:1]), **{key: OuterRef(key)}
    )
    continued = ContinuedRun.objects.using(using).filter(run_id=OuterRef("run_id"))
    return Q(Exists(continued), Exists(current), ~Exists(on_current))


def _late_signals(rows: Any, using: str) -> Any:
    """Of these signals, the buffered ones whose run is no longer active, less those the sweep carries."""
    return (
        rows.filter(state=SignalState.BUFFERED)
        .exclude(Exists(_same_run_active(using)))
        .exclude(to_be_carried(BufferedSignal, "signal_id", using) & ~Q(name__startswith=CHILD_MAILBOX_PREFIX))
    )


def _orphaned_updates(rows: Any, using: str) -> Any:
    """Of these updates, the admitted and accepted ones whose run is no longer active, less those the
    sweep carries."""
    return (
        rows.filter(status__in=[UpdateStatus.ADMITTED, UpdateStatus.ACCEPTED])
        .exclude(Exists(_same_run_active(using)))
        .exclude(Q(status=UpdateStatus.ADMITTED) & to_be_carried(PendingUpdate, "idempotency_key", using))
    )


def _close_late(model: Any, found: list[tuple[Any, str]], select: Any, fields: dict[str, Any], using: str) -> int:
    """Write ``fields`` on the rows ``found`` ((pk, workflow id)) that ``select`` still picks. Their
    workflows' rows are locked first (SKIP LOCKED: one another transaction holds is left for the next
    pass), so no transition (a ``retry()``, which makes a failed run active again with the same run
    id) commits between the check and the write: mail of a run active again is never closed."""
    with transaction.atomic(using=using):
        ids = sorted({workflow_id for _, workflow_id in found})
        if backend(using).skips_locked:
            locked = Workflow.objects.using(using).filter(pk__in=ids).select_for_update(skip_locked=True, no_key=True)
            held = list(locked.order_by("pk").values_list("pk", flat=True))
            # A workflow with no row (purged) has no run to become active again: its mail is late too.
            existing = set(Workflow.objects.using(using).filter(pk__in=ids).values_list("pk", flat=True))
            ids = [*held, *(wid for wid in ids if wid not in existing)]
        rows = model.objects.using(using).filter(pk__in=[pk for pk, _ in found], workflow_id__in=ids)
        return write_unlocked(select(rows, using), fields, using)  # (a savepoint: the locks stay to the end)


def drop_late_signals(using: str) -> int:
    """Mark dropped the buffered signals whose run is no longer active (at most CLEANUP_BATCH).

    signal() takes no lock (a slow caller must never stall the owner or renewal), so a signal can
    commit while the run's terminal commit is in flight, after the statement that drops the run's
    unconsumed signals read them. signal() returned normally (the signal was recorded); the run ended
    without consuming it, so it is dropped, as one sent a moment earlier would have been. A signal of a
    run that continued as new is kept for the sweep's carrying part (``to_be_carried``), unless the
    current run has its id already or it is a child's end record. The rows read are checked again
    where they are written (``_close_late``): a run retried meanwhile keeps them. Returns how many
    were marked."""
    signals = BufferedSignal.objects.using(using)
    late = list(_late_signals(signals, using).values_list("pk", "workflow_id")[:CLEANUP_BATCH])
    if not late:
        return 0
    # Late mail of a workflow that no longer exists is deleted, not marked: a purge deletes a workflow's
    # mail with it, but a child it abandoned, still running, reports its end there when it ends, under
    # the purged id, and nothing else would ever delete that record. (Read from the late rows only: no
    # scan of every signal kept.)
    existing = set(Workflow.objects.using(using).filter(pk__in={wid for _, wid in late}).values_list("pk", flat=True))
    gone = [pk for pk, wid in late if wid not in existing]
    deleted = 0
    if gone:
        exists = Workflow.objects.using(using).filter(pk=OuterRef("workflow_id"))
        deleted = write_unlocked(signals.filter(pk__in=gone).exclude(Exists(exists)), None, using)
    kept = [(pk, wid) for pk, wid in late if wid in existing]
    return deleted + (
        _close_late(BufferedSignal, kept, _late_signals, {"state": SignalState.DROPPED}, using) if kept else 0
    )


def cleanup(now: datetime, cutoff: datetime, grace: timedelta, using: str) -> int:
    """One bounded pass of the message cleanup (each part at most CLEANUP_BATCH rows): expire admitted
    updates whose caller's deadline is more than ``grace`` past, fail the open updates of runs that
    ended, drop late signals, delete settled updates and answered queries older than ``cutoff`` and
    pending queries past their deadline. Returns how many rows changed.

    Args:
        now: workflow time; ``cutoff``: the retention limit; ``grace``: past a deadline before expiry.
    """
    updates = PendingUpdate.objects.using(using)
    done = 0
    # Read first, write only what was found: on SQLite even an UPDATE that matches nothing takes the
    # write lock.
    abandoned = list(
        updates.filter(status=UpdateStatus.ADMITTED, deadline__lt=now - grace).values_list("pk", flat=True)[
            :CLEANUP_BATCH
        ]
    )
    if abandoned:  # their callers stopped waiting and died: nobody will expire them otherwise
        fields = {"status": UpdateStatus.EXPIRED, "completed_at": now}
        done += write_unlocked(updates.filter(pk__in=abandoned, status=UpdateStatus.ADMITTED), fields, using)
    orphaned = list(
        _orphaned_updates(updates.filter(created_at__lt=now - grace), using).values_list("pk", "workflow_id")[
            :CLEANUP_BATCH
        ]
    )
    if orphaned:  # runs that ended through a transition, which closes admitted updates only
        error = {"type": "WorkflowTerminalError", "message": "The workflow ended before the update was answered."}
        fields = {"status": UpdateStatus.FAILED, "completed_at": now, "error": error}
        done += _close_late(PendingUpdate, orphaned, _orphaned_updates, fields, using)
    done += drop_late_signals(using)
    settled = [UpdateStatus.COMPLETED, UpdateStatus.REJECTED, UpdateStatus.FAILED, UpdateStatus.EXPIRED]
    old_updates = list(
        PendingUpdate.objects.using(using)
        .filter(status__in=settled, completed_at__lt=cutoff)
        .values_list("pk", flat=True)[:CLEANUP_BATCH]
    )
    if old_updates:
        done += write_unlocked(PendingUpdate.objects.using(using).filter(pk__in=old_updates), None, using)
    old_queries = list(
        QueryRequest.objects.using(using)
        .filter(status__in=[QueryStatus.ANSWERED, QueryStatus.FAILED, QueryStatus.EXPIRED], created_at__lt=cutoff)
        .values_list("pk", flat=True)[:CLEANUP_BATCH]
    )
    old_queries += list(
        QueryRequest.objects.using(using)
        .filter(status=QueryStatus.PENDING, deadline__lt=now - grace)
        .values_list("pk", flat=True)[:CLEANUP_BATCH]
    )
    if old_queries:
        done += write_unlocked(QueryRequest.objects.using(using).filter(pk__in=old_queries), None, using)
    return done


def held_with_mail(engine_id: str, using: str) -> dict[str, tuple[tuple[str, int, str], ...]]:
    """The workflows held by ``engine_id`` with a buffered signal or an admitted update of their current
    run (the sweep behind LISTEN for evicted workflows, engine/residency.py): read from the buffered
    signals and the admitted updates, each one's claim probed by key, never the engine's held claims.
    Each comes with its mail's mark: per kind ("s" signals, "u" updates) how many and which (the
    highest signal id and the sum of the ids; the earliest and latest update's creation), so that a
    later sweep can tell mail it has seen from new. Late mail of an earlier run is left out: it is
    not this run's until it is carried to it, which changes the mark."""
    claim_table, run_table = WorkflowClaim._meta.db_table, Workflow._meta.db_table
    sql = (
        f"SELECT s.workflow_id, 's', COUNT(*), CAST(MAX(s.id) AS TEXT) || ':' || CAST(SUM(s.id) AS TEXT) "
        f"FROM {SIGNAL_TABLE} s JOIN {claim_table} c ON c.workflow_id = s.workflow_id "
        f"JOIN {run_table} w ON w.id = s.workflow_id AND w.run_id = s.run_id "
        f"WHERE s.{BUFFERED_STATE_SQL} AND c.engine_id = %s GROUP BY s.workflow_id "
        "UNION ALL SELECT u.workflow_id, 'u', COUNT(*), "
        "CAST(MIN(u.created_at) AS TEXT) || ':' || CAST(MAX(u.created_at) AS TEXT) "
        f"FROM {UPDATE_TABLE} u JOIN {claim_table} c ON c.workflow_id = u.workflow_id "
        f"JOIN {run_table} w ON w.id = u.workflow_id AND w.run_id = u.run_id "
        f"WHERE u.status = %s AND c.engine_id = %s GROUP BY u.workflow_id"
    )
    marks: dict[str, list[tuple[str, int, str]]] = {}
    with backend(using).connection.cursor() as cursor:
        cursor.execute(sql, [engine_id, UpdateStatus.ADMITTED, engine_id])
        for workflow_id, kind, count, which in cursor.fetchall():
            marks.setdefault(workflow_id, []).append((kind, int(count), str(which)))
    return {workflow_id: tuple(sorted(mark)) for workflow_id, mark in marks.items()}
