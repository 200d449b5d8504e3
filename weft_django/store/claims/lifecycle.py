"""Claims of runs coming and going (the client side): the unheld claim of a new run, the epoch
rotation of a transition, the family lock of cancel, and the test kit's claim edits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connections
from django.db.models import Subquery

from ...models import Workflow, WorkflowClaim
from ...status import ACTIVE_STATUSES, ParentClosePolicy
from ..backend import backend
from ..clock import db_clock
from ..epochs import next_epoch, next_epoch_sql

# -- client side (start, handles, transitions, schedules, testing) --------------------------

FAMILY_LOCK_ROUNDS = 5  # reads of a family that keeps growing while cancel locks it (then the lock waits)


def unheld_claim_sql(epoch: str = "n.e", runnable: str = "TRUE") -> str:
    """The CTE ``l`` of the one-statement start (PostgreSQL): the unheld claim of each run the CTE ``w``
    inserted, with the time of the CTE ``n`` and ``epoch`` (the CTE ``n``'s one epoch; ``start_many``
    passes ``nextval(...)``: one per row), replacing a leftover row. ``runnable``: the SQL of its
    ``runnable`` (FALSE for a run waiting in a queue: out of acquire's partial index until admitted)."""
    return (
        f"l AS (INSERT INTO {WorkflowClaim._meta.db_table} "
        f"(workflow_id, epoch, engine_id, last_engine_id, claimed_at, expires_at, runnable, run_created_at) "
        f"SELECT w.id, {epoch}, NULL, NULL, NULL, NULL, {runnable}, n.t FROM w, n "
        f"ON CONFLICT (workflow_id) DO UPDATE SET epoch = EXCLUDED.epoch, engine_id = NULL, "
        f"last_engine_id = NULL, claimed_at = NULL, expires_at = NULL, "
        f"runnable = EXCLUDED.runnable, run_created_at = EXCLUDED.run_created_at)"
    )


def write_claim(
    workflow_id: str, epoch: int, using: str, *, runnable: bool = True, created_at: datetime | None = None
) -> None:
    """Insert the claim of a new run with ``epoch`` and no holder (replacing a leftover row).

    Args:
        workflow_id: the run's id; its row is written first (its created_at is acquire's order).
        epoch: a fresh epoch (``next_epoch``).
        using: the connection alias, in the caller's transaction.
        runnable: False for a run no engine should acquire (ended, suspended, waiting in a queue:
            its admission makes it runnable, ``hold_admitted``).
        created_at: the run's created_at when the caller knows it (else it is read back).
    """
    created = (
        created_at
        if created_at is not None
        else Workflow.objects.using(using).filter(pk=workflow_id).values_list("created_at", flat=True).first()
    )
    WorkflowClaim.objects.using(using).bulk_create(
        [WorkflowClaim(workflow_id=workflow_id, epoch=epoch, runnable=runnable, run_created_at=created)],
        update_conflicts=True,
        unique_fields=["workflow_id"],
        update_fields=["epoch", "engine_id", "claimed_at", "expires_at", "runnable", "run_created_at"],
    )


def rotate_epoch(workflow_id: str, using: str, *, runnable: bool = True) -> int:
    """Give the claim a new epoch and no holder (deposing any holder); return the epoch. A missing
    claim row is written. Lock the claim row first (``lock_claim``).

    Args:
        runnable: False when the run just ended or was suspended (no engine should acquire it).
    """
    if backend(using).writes_in_one_statement:
        with backend(using).connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {WorkflowClaim._meta.db_table} SET epoch = {next_epoch_sql('postgresql')}, "
                "engine_id = NULL, claimed_at = NULL, expires_at = NULL, runnable = %s, "
                f"run_created_at = (SELECT created_at FROM {Workflow._meta.db_table} WHERE id = %s) "
                "WHERE workflow_id = %s RETURNING epoch",
                [runnable, workflow_id, workflow_id],
            )
            row = cursor.fetchone()
        if row is not None:
            return int(row[0])
        epoch = next_epoch(using)
    else:
        epoch = next_epoch(using)
        if (
            WorkflowClaim.objects.using(using)
            .filter(pk=workflow_id)
            .update(
                epoch=epoch,
                engine_id=None,
                claimed_at=None,
                expires_at=None,
                runnable=runnable,
                run_created_at=Subquery(Workflow.objects.filter(pk=workflow_id).values("created_at")[:1]),
            )
        ):
            return epoch
    write_claim(workflow_id, epoch, using, runnable=runnable)
    return epoch


def lock_claim(workflow_id: str, using: str) -> None:
    """Lock the claim row of ``workflow_id`` (if any) until the caller's transaction ends."""
    list(WorkflowClaim.objects.using(using).select_for_update().filter(pk=workflow_id).values_list("pk"))


def delete_claims(workflow_ids: list[str], using: str) -> None:
    """Delete the claim rows of these workflows (purge; lock them first)."""
    for chunk in backend(using).chunks(workflow_ids):
        WorkflowClaim.objects.using(using).filter(pk__in=chunk).delete()


def active_descendants(runs: dict[str, str], using: str) -> dict[str, set[str]]:
    """The active descendants that closing these runs would end, per run: each run's active children
    whose parent_close_policy is not ``abandon`` (of that very run), their such children, and so on
    (one recursive query). ``runs`` maps a workflow id to its current run id. An unlocked read: the
    caller locks the claims it returns, then may check again."""
    if not runs:
        return {}
    table = Workflow._meta.db_table
    active = sorted(str(status) for status in ACTIVE_STATUSES)
    marks = ", ".join(["%s"] * len(active))
    abandon = str(ParentClosePolicy.ABANDON.value)
    found: dict[str, set[str]] = {}
    with connections[using].cursor() as cursor:
        for chunk in backend(using).chunks(sorted(runs)):  # one statement unless past the parameter limit
            roots = ", ".join(["%s"] * len(chunk))
            sql = (
                f"WITH RECURSIVE fam(root, root_run, id, run_id) AS ("
                f"SELECT w.parent_id, w.parent_run_id, w.id, w.run_id FROM {table} w WHERE w.parent_id IN ({roots}) "
                f"AND w.status IN ({marks}) AND w.parent_close_policy <> %s "
                f"UNION SELECT fam.root, fam.root_run, w.id, w.run_id FROM {table} w JOIN fam ON w.parent_id = fam.id "
                f"AND w.parent_run_id = fam.run_id WHERE w.status IN ({marks}) AND w.parent_close_policy <> %s"
                f") SELECT root, root_run, id FROM fam"
            )
            cursor.execute(sql, [*chunk, *active, abandon, *active, abandon])
            for root, root_run, child in cursor.fetchall():
                if str(root_run).replace("-", "") == str(runs[root]).replace("-", ""):
                    found.setdefault(root, set()).add(child)
    return found


def held_claims(engine_id: str, using: str) -> dict[str, int]:
    """The claims ``engine_id`` holds now: {workflow id: epoch} (the test kit)."""
    rows = WorkflowClaim.objects.using(using).filter(engine_id=engine_id)
    return dict(rows.values_list("workflow_id", "epoch"))


def expire_claims(engine_id: str | None, workflow_ids: list[str] | None, using: str) -> int:
    """Move held claims' expiry far into the past (the test kit: a takeover without waiting a TTL).
    Selects an engine's claims, or given workflows' (held ones only), or every held claim. Returns how many."""
    rows = WorkflowClaim.objects.using(using).filter(engine_id__isnull=False)
    if engine_id is not None:
        rows = rows.filter(engine_id=engine_id)
    past = datetime(2000, 1, 1, tzinfo=UTC)
    if workflow_ids is not None:
        chunks = backend(using).chunks(workflow_ids)
        return sum(rows.filter(workflow_id__in=chunk).update(expires_at=past) for chunk in chunks)
    return rows.update(expires_at=past)


def cap_expiry(engine_id: str, ttl: timedelta, using: str) -> int:
    """Cut the expiry of ``engine_id``'s claims to at most ``ttl`` from now (the database clock): at an
    engine's start-up, the dormant claims a previous process with its id left (engine/ownership.py).
    Returns how many were cut. One statement, its rows locked in workflow_id order, skipping a row
    another transaction holds (a user's open transaction): waiting for it (the session's lock_timeout)
    failed the engine's start-up. A claim skipped keeps its expiry."""
    found, table = backend(using), WorkflowClaim._meta.db_table
    latest = found.connection.ops.adapt_datetimefield_value(db_clock(using) + ttl)
    lock = found.lock_sql(no_key=True, skip_locked=True)
    with found.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET expires_at = %s WHERE workflow_id IN (SELECT workflow_id FROM {table} "
            f"WHERE engine_id = %s AND expires_at > %s ORDER BY workflow_id{lock})",
            [latest, engine_id, latest],
        )
        return int(cursor.rowcount)
