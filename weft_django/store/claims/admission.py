"""The claims of admitted runs: a queue's admission (``store/queues.py``) makes the admitting engine the
holder of the runs it admitted, in the admission's transaction, after it locked them (in workflow_id
order, in one statement, before any write: ``lock_ids``); and the delayed starts an engine fires
(``start_delayed``): pending runs whose delayed_start timer is due, made running and claimed."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from ...models import Timer, Workflow, WorkflowClaim
from ...status import TimerKind, WorkflowStatus
from ..backend import backend
from ..clock import _python_now
from ..epochs import next_epoch, next_epoch_sql

CLAIM_TABLE = WorkflowClaim._meta.db_table


def _ms(delta: timedelta) -> int:
    return round(delta.total_seconds() * 1000)


def hold_admitted(engine_id: str, workflow_ids: list[str], ttl: timedelta, using: str) -> dict[str, int]:
    """Inside the admission's transaction, the claims already locked: give each unheld one a fresh epoch
    and ``engine_id`` as its holder (and last holder), runnable. Returns {workflow_id: epoch}.

    Args:
        engine_id: the admitting engine; ``workflow_ids``: the runs it admitted.
        ttl: the claims' time to live; ``using``: the connection alias.
    """
    ids = sorted(set(workflow_ids))
    if not ids:
        return {}
    found = backend(using)
    marks = ", ".join(["%s"] * len(ids))
    with found.connection.cursor() as cursor:
        if found.has_clock:
            cursor.execute(
                f"UPDATE {CLAIM_TABLE} SET epoch = {next_epoch_sql('postgresql')}, engine_id = %s, "
                f"last_engine_id = %s, claimed_at = clock_timestamp(), "
                f"expires_at = clock_timestamp() + %s * interval '1 millisecond', runnable = TRUE "
                f"WHERE engine_id IS NULL AND workflow_id IN ({marks}) RETURNING workflow_id, epoch",
                [engine_id, engine_id, _ms(ttl), *ids],
            )
            return {wid: int(epoch) for wid, epoch in cursor.fetchall()}
        held: dict[str, int] = {}
        clock = _python_now()
        for wid in ids:
            epoch = next_epoch(using)
            cursor.execute(
                f"UPDATE {CLAIM_TABLE} SET epoch = %s, engine_id = %s, last_engine_id = %s, claimed_at = %s, "
                f"expires_at = %s, runnable = %s WHERE engine_id IS NULL AND workflow_id = %s",
                [epoch, engine_id, engine_id, clock, clock + ttl, True, wid],
            )
            if cursor.rowcount == 1:
                held[wid] = epoch
        return held


def start_delayed(engine_id: str, *, limit: int, ttl: timedelta, now: datetime, using: str) -> dict[str, int]:
    """Start pending workflows whose delayed_start timer is due at ``now`` (workflow time) and claim
    them for ``engine_id``, in one transaction; SKIP LOCKED splits the work between engines. Lock order
    as everywhere: claim, then workflow, then timers. Returns {workflow_id: epoch} of the runs started.

    Args:
        engine_id: the new holder; ``limit``: at most this many; ``ttl``: the claims' time to live.
    """
    found = backend(using)
    due = list(
        Timer.objects.using(using)
        .filter(kind=TimerKind.DELAYED_START, fire_at__lte=now)
        .order_by("fire_at")
        .values_list("workflow_id", flat=True)[:limit]
    )
    if not due:
        return {}
    started: dict[str, int] = {}
    lock = found.lock_sql(skip_locked=True)
    # ``limit`` is CLAIM_BATCH_SIZE: its ids go in chunks past the database's parameter limit.
    with transaction.atomic(using=using), found.connection.cursor() as cursor:
        locked: list[str] = []
        for chunk in found.chunks(sorted(due)):
            marks = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"SELECT workflow_id FROM {CLAIM_TABLE} WHERE workflow_id IN ({marks}) ORDER BY workflow_id{lock}",
                chunk,
            )
            locked += [row[0] for row in cursor.fetchall()]
        if not locked:
            return {}
        # SKIP LOCKED here too: a pending run's row held by a user's open transaction is left, with its
        # timer, for a later pass (waiting for it stalled the pass, and its failure reloaded every workflow).
        runs = Workflow.objects.using(using)
        rows: dict[str, str] = {}
        for chunk in found.chunks(locked):
            rows.update(
                runs.select_for_update(skip_locked=found.skips_locked).filter(id__in=chunk).values_list("id", "status")
            )
        # And their delayed-start timers, SKIP LOCKED: a run one of whose timers a user's open transaction
        # holds is left, whole, for a later pass (the DELETE below waited for it: the pass stalled, and its
        # failure reloaded every workflow of the engine, pass after pass).
        timers = _lock_delayed_timers(sorted(rows), using)
        rows = {wid: status for wid, status in rows.items() if wid in timers}
        pending = sorted(wid for wid, status in rows.items() if status == WorkflowStatus.PENDING)
        for chunk in found.chunks(pending):
            runs.filter(id__in=chunk).update(status=WorkflowStatus.RUNNING, started_at=now, updated_at=now)
        clock = None if found.has_clock else _python_now()
        for wid in sorted(pending):
            epoch = next_epoch(using)
            if clock is None:
                cursor.execute(
                    f"UPDATE {CLAIM_TABLE} SET epoch = %s, engine_id = %s, last_engine_id = %s, "
                    f"claimed_at = clock_timestamp(), expires_at = clock_timestamp() + %s * interval '1 millisecond' "
                    f"WHERE workflow_id = %s",
                    [epoch, engine_id, engine_id, _ms(ttl), wid],
                )
            else:
                cursor.execute(
                    f"UPDATE {CLAIM_TABLE} SET epoch = %s, engine_id = %s, last_engine_id = %s, claimed_at = %s, "
                    f"expires_at = %s WHERE workflow_id = %s",
                    [epoch, engine_id, engine_id, clock, clock + ttl, wid],
                )
            started[wid] = epoch
        doomed = sorted(pk for wid in rows for pk in timers[wid])
        for pks in found.chunks(doomed):
            Timer.objects.using(using).filter(pk__in=pks).delete()
    return started


def _lock_delayed_timers(workflow_ids: list[str], using: str) -> dict[str, list[int]]:
    """Inside the delayed starts' transaction: lock the delayed-start timers of these runs, skipping rows
    another transaction holds. Returns {workflow id: its timers' pks} of the runs none of whose timers
    is held elsewhere (all locked now)."""
    found = backend(using)
    timers = Timer.objects.using(using).filter(kind=TimerKind.DELAYED_START)
    every: dict[str, list[int]] = {wid: [] for wid in workflow_ids}
    locked: set[int] = set()
    for chunk in found.chunks(workflow_ids):
        for pk, wid in timers.filter(workflow_id__in=chunk).values_list("pk", "workflow_id"):
            every[wid].append(pk)
        free = timers.filter(workflow_id__in=chunk).order_by("pk")
        if found.skips_locked:
            free = free.select_for_update(skip_locked=True)
        locked.update(free.values_list("pk", flat=True))
    return {wid: pks for wid, pks in every.items() if locked.issuperset(pks)}
