"""Reading stored histories for the replay check (``manage.py weft replay``) and ``weft export``:
pages of runs with their steps, applied updates and timer positions, inside a transaction the
database itself keeps read-only (PostgreSQL ``SET TRANSACTION READ ONLY``, SQLite
``PRAGMA query_only``), so checking a deploy can never write."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from ..models import Workflow
from ..status import TERMINAL_STATUSES
from .backend import backend
from .damaged_rows import UnreadableRow
from .histories import AppliedRecord, StepRecord, load_applied, load_steps, load_timers
from .moments import readable_values


@dataclasses.dataclass
class StoredHistory:
    """One run as replay reads it: the run's columns, its step log, applied updates and the
    positions its timers hold."""

    workflow_id: str
    run_id: str
    workflow_type: str
    version: str
    status: str
    input: str
    result: str | None
    error: Any
    started_at: datetime | None
    created_at: datetime | None
    steps: dict[int, StepRecord] = dataclasses.field(default_factory=dict)
    applied: list[AppliedRecord] = dataclasses.field(default_factory=list)
    timer_seqs: set[int] = dataclasses.field(default_factory=set)
    timer_kinds: dict[int, str] = dataclasses.field(default_factory=dict)  # what armed them (older exports: none)
    fork_origin: Any = None  # weft.fork's deterministic.Lineage as JSON (older exports: none)
    # What of the run cannot be read (a hand edit): a timestamp Python cannot represent, by column, with
    # its stored text (the column reads as None), or "history": why its steps, updates or timers cannot.
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)


_COLUMNS = (
    "id",
    "run_id",
    "workflow_type",
    "version",
    "status",
    "input",
    "result",
    "error",
    "started_at",
    "created_at",
    "fork_origin",
)


@contextlib.contextmanager
def read_only(using: str) -> Iterator[None]:
    """A transaction in which the database refuses every write (an attempt raises DatabaseError); on
    PostgreSQL, outside a caller's transaction, REPEATABLE READ (its reads share one snapshot). On
    SQLite it is DEFERRED (Django's own transaction, its mode switched for this block): the IMMEDIATE
    one the engines need would hold the database's one write lock while a page is replayed; a
    deferred one reads a snapshot and locks nothing. Atomic blocks inside it are savepoints.

    Args:
        using: the connection alias.
    """
    store = backend(using)
    connection = connections[using]
    begin, end = store.read_only_sql
    if (
        not connection.in_atomic_block and connection.get_autocommit()
    ):  # its own transaction: the runs, steps and timers of a page from
        begin = (*store.snapshot_sql, *begin)  # one snapshot (else a commit between two reads mixes them)
    mode = store.read_transaction_mode
    switch = mode is not None and not connection.in_atomic_block and hasattr(connection, "transaction_mode")
    previous = getattr(connection, "transaction_mode", None)
    if switch:
        setattr(connection, "transaction_mode", mode)  # noqa: B010 - SQLite's wrapper has it, the base type not
    try:
        with transaction.atomic(using=using):
            if switch:  # the BEGIN is sent: nested blocks are savepoints
                setattr(connection, "transaction_mode", previous)  # noqa: B010
                switch = False
            with connection.cursor() as cursor:
                for statement in begin:
                    cursor.execute(statement)
            yield
    finally:
        if switch:
            setattr(connection, "transaction_mode", previous)  # noqa: B010
        if end:  # after the transaction ended (a failed one accepts no statement before its rollback)
            with connection.cursor() as cursor:
                for statement in end:
                    cursor.execute(statement)


def page(
    using: str,
    *,
    after: str | None = None,
    size: int = 500,
    workflow_types: list[str] | None = None,
    since: datetime | None = None,
    open_only: bool = False,
    workflow_ids: list[str] | None = None,
) -> list[StoredHistory]:
    """The next ``size`` runs in workflow id order after ``after``, with their histories.

    Args:
        using: the connection alias.
        after: the last workflow id of the previous page (None: from the start).
        size: at most this many runs.
        workflow_types: only these types (None: all).
        since: only runs created at or after this time.
        open_only: only runs that have not ended (the ones an engine still replays).
        workflow_ids: only these workflows.
    """
    rows = Workflow.objects.using(using).order_by("id")
    if after is not None:
        rows = rows.filter(id__gt=after)
    if workflow_types:
        rows = rows.filter(workflow_type__in=workflow_types)
    if since is not None:
        rows = rows.filter(created_at__gte=since)
    if open_only:
        rows = rows.exclude(status__in=list(TERMINAL_STATUSES))
    if workflow_ids is not None:
        rows = rows.filter(id__in=workflow_ids)
    found = [_history(values) for values in readable_values(rows, _COLUMNS)[:size]]
    if not found:
        return found
    try:
        _load_histories(found, using)
    except UnreadableRow:  # a row of one run's history cannot be read: find whose, read the others
        for history in found:
            try:
                _load_histories([history], using)
            except UnreadableRow as exc:
                history.unreadable["history"] = str(exc)
    return found


def _load_histories(found: list[StoredHistory], using: str) -> None:
    """The steps, applied updates and timer positions of these runs, set on each."""
    run_ids = [history.run_id for history in found]
    steps = load_steps(run_ids, using)
    applied = load_applied(run_ids, using)
    timers = load_timers([history.workflow_id for history in found], using)
    for history in found:
        history.steps = steps.get(history.run_id, {})
        history.applied = applied.get(history.run_id, [])
        history.timer_kinds = {
            timer.seq: timer.kind
            for timer in timers.get(history.workflow_id, [])
            if timer.seq is not None and str(timer.run_id) == history.run_id
        }
        history.timer_seqs = set(history.timer_kinds)


def one(workflow_id: str, using: str) -> StoredHistory | None:
    """The current run of this workflow with its history, or None (no such workflow).

    Args:
        workflow_id: the workflow.
        using: the connection alias.
    """
    found = page(using, workflow_ids=[workflow_id], size=1)
    return found[0] if found else None


def _history(row: dict[str, Any]) -> StoredHistory:
    history = StoredHistory(*(row[name] for name in _COLUMNS[:-1]))
    history.run_id = str(history.run_id)
    history.fork_origin = row["fork_origin"]
    history.unreadable = dict(row.get("unreadable", {}))
    return history
