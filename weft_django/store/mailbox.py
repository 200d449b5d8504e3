"""The mailbox: buffered signals and pending updates (insert, consume, settle, close, drop)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import transaction

from ..codec import encode
from ..models import BufferedSignal, PendingUpdate, QueryRequest, Workflow
from ..status import SignalState, UpdateStatus, WorkflowStatus
from . import notify, prepared
from .backend import backend
from .clock import db_now, workflow_now_sql

# -- client side (start, handles, transitions, schedules, testing) --------------------------

ENDED_BEFORE_APPLIED = {"type": "WorkflowTerminalError", "message": "The workflow ended before the update was applied."}
_ACTIVE = [str(status.value) for status in (WorkflowStatus.PENDING, WorkflowStatus.RUNNING, WorkflowStatus.SUSPENDED)]


def close_mailboxes(
    workflow_ids: list[str], now: datetime, using: str, *, error: Mapping[str, str] | None = None
) -> None:
    """Close the mailbox of these runs (they ended): unconsumed signals are dropped, admitted and
    accepted updates fail, as nothing will ever handle them now. In the caller's transaction.

    Args:
        workflow_ids: the runs that ended.
        now: workflow time, the updates' completed_at.
        using: the connection alias.
        error: the failed updates' error (default ``ENDED_BEFORE_APPLIED``).
    """
    BufferedSignal.objects.using(using).filter(workflow_id__in=workflow_ids, state=SignalState.BUFFERED).update(
        state=SignalState.DROPPED
    )
    PendingUpdate.objects.using(using).filter(
        workflow_id__in=workflow_ids, status__in=[UpdateStatus.ADMITTED, UpdateStatus.ACCEPTED]
    ).update(status=UpdateStatus.FAILED, error=dict(error or ENDED_BEFORE_APPLIED), completed_at=now)


def buffer_signal(workflow_id: str, name: str, text: str, signal_id: str | None, using: str) -> bool:
    """Append a signal to the current run's mailbox while that run is active, and send the wake-up.

    On PostgreSQL one statement, the NOTIFY riding in it (delivered when it, or the caller's
    transaction, commits); elsewhere engines poll. No lock on the claim: a slow caller must never
    stall renewal. Returns whether a row was inserted (False: no active run, or a repeated
    ``signal_id`` of this run)."""
    store = backend(using)
    connection = store.connection
    signals, workflows = BufferedSignal._meta.db_table, Workflow._meta.db_table
    if store.writes_in_one_statement:
        now_sql, now_params = workflow_now_sql("postgresql"), []
    else:
        now_sql, now_params = "%s", [connection.ops.adapt_datetimefield_value(db_now(using))]
    # Table names are the models' own; every value is a parameter.
    insert = (
        f"INSERT INTO {signals} (workflow_id, run_id, name, signal_id, payload, state, created_at) "
        f"SELECT w.id, w.run_id, %s, %s, %s, %s, {now_sql} FROM {workflows} w "
        f"WHERE w.id = %s AND w.status IN (%s, %s, %s) ON CONFLICT DO NOTHING"
    )
    params = [name, signal_id, text, str(SignalState.BUFFERED.value), *now_params, workflow_id, *_ACTIVE]
    with connection.cursor() as cursor:
        if store.writes_in_one_statement:
            wake = f"w:{workflow_id}" if len(workflow_id) < notify.MAX_PAYLOAD - 2 else "w:*"
            prepared.execute(
                cursor,
                connection,
                f"WITH s AS ({insert} RETURNING workflow_id) SELECT pg_notify(%s, %s) FROM s",
                [*params, notify.CHANNEL, wake],
            )
            return len(cursor.fetchall()) == 1
        cursor.execute(insert, params)
        return bool(cursor.rowcount == 1)


CHILD_MAILBOX_PREFIX = "__weft_child__:"


def child_mailbox_name(seq: int) -> str:
    """The reserved signal name (and signal id) under which a child reports to its parent's step ``seq``."""
    return f"{CHILD_MAILBOX_PREFIX}{seq}"


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
    buffered signal under the reserved name of the step ``parent_seq`` (idempotent by its reserved id).

    Args:
        child_id: the child that ended; ``status``, ``result_text`` (codec text) and ``error`` its end.
        parent_id, parent_run_id, parent_seq: the parent run and the step that waits for the child.
        now: workflow time (the signal's created_at).
        using: the connection alias, in the caller's transaction.
    """
    name = child_mailbox_name(parent_seq)
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
    notify.send_many("w", [parent_id], using)


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
    workflow_id: str, run_id: Any, name: str, text: str, key: str | None, now: datetime, deadline: datetime, using: str
) -> str:
    """Insert an admitted update into run ``run_id``'s mailbox and wake its engine; return its id.
    IntegrityError when the run already has an update with idempotency key ``key``."""
    admitted = PendingUpdate.objects.using(using).create(
        workflow_id=workflow_id,
        run_id=run_id,
        name=name,
        payload=text,
        idempotency_key=key,
        created_at=now,
        deadline=deadline,
    )
    notify.send("w", workflow_id, using)
    return str(admitted.id)


def readmit_update(workflow_id: str, update_id: Any, text: str, now: datetime, deadline: datetime, using: str) -> None:
    """Admit an expired update again (a retry with its idempotency key) and wake the run's engine."""
    PendingUpdate.objects.using(using).filter(pk=update_id, status=UpdateStatus.EXPIRED).update(
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
