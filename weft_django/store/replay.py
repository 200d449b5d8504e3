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
from .histories import AppliedRecord, StepRecord, load_applied, load_steps, load_timers


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
)


@contextlib.contextmanager
def read_only(using: str) -> Iterator[None]:
    """A transaction in which the database refuses every write (an attempt raises DatabaseError).

    Args:
        using: the connection alias.
    """
    store = backend(using)
    if store.read_snapshot_sql is not None and not connections[using].in_atomic_block:
        # SQLite: Django's transaction would be IMMEDIATE and hold the one write lock (every engine
        # stalled) while the page is replayed; a deferred one reads a snapshot and locks nothing.
        opening, closing = store.read_snapshot_sql
        with connections[using].cursor() as cursor:
            for statement in opening:
                cursor.execute(statement)
        try:
            yield
        finally:
            with connections[using].cursor() as cursor:
                for statement in closing:
                    cursor.execute(statement)
        return
    begin, end = store.read_only_sql
    try:
        with transaction.atomic(using=using):
            with connections[using].cursor() as cursor:
                for statement in begin:
                    cursor.execute(statement)
            yield
    finally:
        if end:
            with connections[using].cursor() as cursor:
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
    found = [_history(values) for values in rows.values_list(*_COLUMNS)[:size]]
    if not found:
        return found
    run_ids = [history.run_id for history in found]
    steps = load_steps(run_ids, using)
    applied = load_applied(run_ids, using)
    timers = load_timers([history.workflow_id for history in found], using)
    for history in found:
        history.steps = steps.get(history.run_id, {})
        history.applied = applied.get(history.run_id, [])
        history.timer_seqs = {
            timer.seq
            for timer in timers.get(history.workflow_id, [])
            if timer.seq is not None and str(timer.run_id) == history.run_id
        }
    return found


def one(workflow_id: str, using: str) -> StoredHistory | None:
    """The current run of this workflow with its history, or None (no such workflow).

    Args:
        workflow_id: the workflow.
        using: the connection alias.
    """
    found = page(using, workflow_ids=[workflow_id], size=1)
    return found[0] if found else None


def _history(values: tuple[Any, ...]) -> StoredHistory:
    wid, run_id, workflow_type, version, status, text, result, error, started_at, created_at = values
    return StoredHistory(wid, str(run_id), workflow_type, version, status, text, result, error, started_at, created_at)
