"""Engine-scoped chores' statements: retention purge and sweeps."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from ..conf import queues
from ..models import (
    AppliedUpdate,
    BufferedSignal,
    ContinuedRun,
    IdempotencyKey,
    PendingUpdate,
    QueryRequest,
    RemoteAttempt,
    Step,
    Timer,
    Workflow,
    WorkflowAttribute,
    WorkflowClaim,
)
from ..status import ACTIVE_STATUSES
from .backend import backend

# Rows that belong to a run and go with it (Workflow itself and its claim are handled separately).
RUN_TABLES = (
    Step,
    Timer,
    BufferedSignal,
    PendingUpdate,
    AppliedUpdate,
    RemoteAttempt,
    WorkflowAttribute,
    ContinuedRun,
)

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


def held_elsewhere(workflow_ids: list[str], keys: dict[str, str], using: str) -> set[str]:
    """Inside the retention sweep's purge, which found a row it deletes held by another transaction (a
    user's open one): lock every row the purge of these runs deletes or writes (their claims, their run's
    rows, their query requests, ``keys``: {idempotency key: run} of the keys it marks purged), ``FOR
    UPDATE`` (the lock a DELETE takes, blocked by any other) skipping those another transaction holds.
    One statement per table (and chunk). PostgreSQL only.

    Returns:
        The runs with a row held elsewhere: left for a later purge (the others' rows are locked now).
    """
    found, held = backend(using), set[str]()
    tables = [(model._meta.db_table, model._meta.pk.column) for model in (*RUN_TABLES, QueryRequest)]
    tables.append((WorkflowClaim._meta.db_table, "workflow_id"))
    with found.connection.cursor() as cursor:
        for table, key in tables:
            for chunk in found.chunks(workflow_ids, per_item=2):
                marks = ", ".join(["%s"] * len(chunk))
                cursor.execute(
                    f"SELECT DISTINCT t.workflow_id FROM {table} t WHERE t.workflow_id IN ({marks}) AND t.{key} NOT IN "
                    f"(SELECT s.{key} FROM {table} s WHERE s.workflow_id IN ({marks}) FOR UPDATE SKIP LOCKED)",
                    [*chunk, *chunk],
                )
                held.update(row[0] for row in cursor.fetchall())
        table = IdempotencyKey._meta.db_table
        for chunk in found.chunks(sorted(keys), per_item=2):
            marks = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"SELECT k.key FROM {table} k WHERE k.key IN ({marks}) AND k.key NOT IN "
                f"(SELECT s.key FROM {table} s WHERE s.key IN ({marks}) FOR UPDATE SKIP LOCKED)",
                [*chunk, *chunk],
            )
            held.update(keys[row[0]] for row in cursor.fetchall())
    return held


def rate_windows(now: datetime) -> dict[str, datetime]:
    """Per rate-limited queue (WEFT["QUEUES"]), the start of its rate window at ``now``."""
    return {name: now - queue.rate.period for name, queue in queues().items() if queue.rate is not None}


def kept_whatever_their_age(runs: QuerySet[Workflow], now: datetime, using: str) -> QuerySet[Workflow]:
    """``runs`` less those retention keeps whatever RETENTION says: a child whose parent is still
    active, and a run a rate-limited queue admitted within its rate window (the queue counts its
    admissions from their rows). The one rule for the engine's sweep, ``weft purge`` and the admin."""
    for queue, since in rate_windows(now).items():
        runs = runs.exclude(Q(queue=queue, admitted_at__gt=since))
    parent_active = Workflow.objects.using(using).filter(pk=OuterRef("parent_id"), status__in=list(ACTIVE_STATUSES))
    return runs.exclude(Exists(parent_active))


def expired_runs(
    status: str, cutoff: datetime, limit: int, using: str, now: datetime
) -> tuple[QuerySet[Workflow], list[Any]]:
    """The runs of ``status`` that finished before ``cutoff`` and that retention does not keep
    (``kept_whatever_their_age`` at ``now``), and the ids of the oldest ``limit`` of them.

    Returns:
        (the queryset of every expired run of that status, re-checked by a purge under the claims'
        lock; the ids to purge).
    """
    expired = Workflow.objects.using(using).filter(status=status, finished_at__lt=cutoff)
    expired = kept_whatever_their_age(expired, now, using)
    ids = list(expired.order_by("finished_at").values_list("pk", flat=True)[:limit])
    return expired, ids
