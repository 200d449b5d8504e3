"""Claims: acquire, renew, release, takeover. Together with transitions.py, the only writer of
claim rows. Every statement uses the database clock (clock_timestamp()), never the engine's.
Every statement here that makes an engine the holder sets last_engine_id to it too (a release keeps
it), so a claim still names the engine that last took it after the run ended.

acquire / takeover: candidates are locked with SKIP LOCKED and rewritten with a fresh epoch only if
they still have the exact holder and epoch that were seen: one row back means it is ours.
renew: one statement for all of an engine's claims, skipping rows a commit holds (the commit in flight
proves ownership; retried next tick). A claim is lost only when a plain re-read shows another epoch
or holder.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

from django.db import connections, transaction

from .. import events
from ..clock import _python_now, workflow_now_sql
from ..epochs import next_epoch, next_epoch_sql
from ..models import Engine
from ..notify import send
from .fencing import CLAIM_TABLE

logger = logging.getLogger(__name__)
WORKFLOW_TABLE = "weft_django_workflow"
TAKEOVER_GRACE_MULTIPLIER = 2


def _ms(delta: timedelta) -> int:
    return round(delta.total_seconds() * 1000)


# The claimable runs, oldest first: unheld claims of running workflows. They are read in order from
# the partial index weft_claim_free on run_created_at (unheld AND runnable: not held elsewhere, not
# the released claims of finished runs, which stay until retention), each one's workflow row probed
# by key, until the batch is full: the work is bounded by the batch, not by the running or finished
# workflows, whatever the planner's statistics. (The probe's LIMIT keeps it a parameterised lookup
# by key: filters on status inside it would let the planner pick a status index and loop over it.)
_FREE_PG = f"""
    SELECT c.workflow_id, c.epoch, c.engine_id
    FROM {CLAIM_TABLE} c CROSS JOIN LATERAL (
        SELECT w.status, w.stuck_retry_at FROM {WORKFLOW_TABLE} w WHERE w.id = c.workflow_id LIMIT 1) w
    WHERE c.engine_id IS NULL AND c.runnable AND w.status = 'running'
      AND (w.stuck_retry_at IS NULL OR w.stuck_retry_at <= {workflow_now_sql("postgresql")})
    ORDER BY c.run_created_at
    LIMIT %s
    FOR NO KEY UPDATE OF c SKIP LOCKED"""


def _held_pg(holder: str) -> str:
    """Candidates among held claims (takeover): every running workflow's claim is looked at."""
    return f"""
    SELECT c.workflow_id, c.epoch, c.engine_id
    FROM {CLAIM_TABLE} c JOIN {WORKFLOW_TABLE} w ON w.id = c.workflow_id
    WHERE w.status = 'running' AND {holder}
      AND (w.stuck_retry_at IS NULL OR w.stuck_retry_at <= {workflow_now_sql("postgresql")})
    ORDER BY w.created_at
    LIMIT %s
    FOR NO KEY UPDATE OF c SKIP LOCKED"""


# Takeover candidates (constant SQL: the conditions take their values as parameters).
_HELD_BY_OTHERS = "c.engine_id IS NOT NULL AND c.engine_id <> %s"
_EXPIRED_PG = _held_pg("c.engine_id IS NOT NULL AND c.expires_at + %s * interval '1 millisecond' < clock_timestamp()")
_OTHERS_PG = _held_pg(_HELD_BY_OTHERS)


def _claim_pg(
    candidates: str, params: list[Any], engine_id: str, ttl: timedelta, using: str
) -> dict[str, tuple[int, str | None]]:
    """Lock the candidates (SKIP LOCKED) and give each a fresh epoch and this holder (also recorded as
    the claim's last holder), only if it still has the holder and epoch seen: one row back means it is
    ours. One statement: in autocommit it is its own transaction (no BEGIN/COMMIT round trips)."""
    sql = f"""
        WITH candidates AS ({candidates})
        UPDATE {CLAIM_TABLE} AS claim
        SET epoch = {next_epoch_sql("postgresql")}, engine_id = %s, last_engine_id = %s,
            claimed_at = clock_timestamp(), expires_at = clock_timestamp() + %s * interval '1 millisecond'
        FROM candidates
        WHERE claim.workflow_id = candidates.workflow_id AND claim.epoch = candidates.epoch
          AND claim.engine_id IS NOT DISTINCT FROM candidates.engine_id
        RETURNING claim.workflow_id, claim.epoch, candidates.engine_id
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [*params, engine_id, engine_id, _ms(ttl)])
        return {wid: (epoch, previous) for wid, epoch, previous in cursor.fetchall()}


def acquire(
    engine_id: str,
    *,
    limit: int,
    ttl: timedelta,
    renew_interval: timedelta,
    using: str,
    takeover: bool = False,
) -> dict[str, tuple[int, str | None]]:
    """Claim up to ``limit`` running workflows that no engine holds (or, with ``takeover``, whose holder's
    claim expired more than the grace ago). Returns {workflow_id: (new epoch, previous holder)}."""
    if limit <= 0:
        return {}
    if connections[using].vendor == "postgresql":
        if not takeover:
            return _claim_pg(_FREE_PG, [limit], engine_id, ttl, using)
        grace = _ms(renew_interval) * TAKEOVER_GRACE_MULTIPLIER
        return _claim_pg(_EXPIRED_PG, [grace, limit], engine_id, ttl, using)
    if takeover:
        params: list[Any] = [_python_now() - renew_interval * TAKEOVER_GRACE_MULTIPLIER]
        return _acquire_sqlite(engine_id, "c.engine_id IS NOT NULL AND c.expires_at < %s", params, limit, ttl, using)
    return _acquire_sqlite(engine_id, None, [], limit, ttl, using)


def _acquire_sqlite(
    engine_id: str, holder: str | None, params: list[Any], limit: int, ttl: timedelta, using: str
) -> dict[str, tuple[int, str | None]]:
    """``holder``: the condition on held claims (takeover), or None for the unheld runnable ones,
    read in order from the partial index weft_claim_free (CROSS JOIN keeps SQLite's join order:
    claims first, each workflow looked up by key)."""
    # One writer at a time (IMMEDIATE): what we read inside the transaction stays true until commit.
    from ..clock import offset

    now = _python_now()
    wf_now = now + offset(using)
    if holder is None:
        source = f"{CLAIM_TABLE} c CROSS JOIN {WORKFLOW_TABLE} w ON w.id = c.workflow_id"
        holder, order = "c.engine_id IS NULL AND c.runnable", "c.run_created_at"
    else:
        source, order = f"{CLAIM_TABLE} c JOIN {WORKFLOW_TABLE} w ON w.id = c.workflow_id", "w.created_at"
    claimed: dict[str, tuple[int, str | None]] = {}
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(
            f"""SELECT c.workflow_id, c.epoch, c.engine_id FROM {source}
                WHERE w.status = 'running' AND {holder}
                  AND (w.stuck_retry_at IS NULL OR w.stuck_retry_at <= %s)
                ORDER BY {order} LIMIT %s""",
            [*params, wf_now, limit],
        )
        for wid, seen_epoch, seen_holder in cursor.fetchall():
            epoch = next_epoch(using)
            cursor.execute(
                f"""UPDATE {CLAIM_TABLE} SET epoch = %s, engine_id = %s, last_engine_id = %s, claimed_at = %s,
                        expires_at = %s
                    WHERE workflow_id = %s AND epoch = %s AND engine_id IS %s""",
                [epoch, engine_id, engine_id, now, now + ttl, wid, seen_epoch, seen_holder],
            )
            if cursor.rowcount == 1:
                claimed[wid] = (epoch, seen_holder)
    return claimed


def renew(engine_id: str, owned: dict[str, int], ttl: timedelta, using: str) -> set[str]:
    """Extend every claim still held at its epoch. Returns the ids found lost (another epoch or
    holder on a plain re-read); rows skipped because a commit holds them are neither renewed nor lost."""
    if not owned:
        return set()
    connection = connections[using]
    ids = sorted(owned)
    epochs = [owned[i] for i in ids]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"""WITH mine AS (
                        SELECT c.workflow_id FROM {CLAIM_TABLE} c
                        JOIN unnest(%s::text[], %s::bigint[]) AS o(workflow_id, epoch)
                          ON o.workflow_id = c.workflow_id AND o.epoch = c.epoch
                        WHERE c.engine_id = %s
                        ORDER BY c.workflow_id FOR NO KEY UPDATE OF c SKIP LOCKED)
                    UPDATE {CLAIM_TABLE} AS claim SET expires_at = clock_timestamp() + %s * interval '1 millisecond'
                    FROM mine WHERE claim.workflow_id = mine.workflow_id RETURNING claim.workflow_id""",
                [ids, epochs, engine_id, _ms(ttl)],
            )
            renewed = {row[0] for row in cursor.fetchall()}
        else:
            with transaction.atomic(using=using):
                now = _python_now()
                renewed = set()
                for chunk in range(0, len(ids), 500):
                    part = ids[chunk : chunk + 500]
                    marks = ", ".join(["%s"] * len(part))
                    cursor.execute(
                        f"SELECT workflow_id, epoch FROM {CLAIM_TABLE} "
                        f"WHERE engine_id = %s AND workflow_id IN ({marks})",
                        [engine_id, *part],
                    )
                    mine = [wid for wid, epoch in cursor.fetchall() if owned[wid] == epoch]
                    if mine:
                        marks = ", ".join(["%s"] * len(mine))
                        cursor.execute(
                            f"UPDATE {CLAIM_TABLE} SET expires_at = %s WHERE workflow_id IN ({marks})",
                            [now + ttl, *mine],
                        )
                    renewed.update(mine)
        missing = [wid for wid in ids if wid not in renewed]
        if not missing:
            return set()
        marks = ", ".join(["%s"] * len(missing))
        cursor.execute(
            f"SELECT workflow_id, epoch, engine_id FROM {CLAIM_TABLE} WHERE workflow_id IN ({marks})", missing
        )
        current = {wid: (epoch, holder) for wid, epoch, holder in cursor.fetchall()}
    return {wid for wid in missing if current.get(wid) != (owned[wid], engine_id)}


def release(engine_id: str, owned: dict[str, int], using: str) -> None:
    """Release claims at their epochs (graceful shutdown): holder cleared, epoch kept."""
    from .fencing import release_claims

    if owned:
        with transaction.atomic(using=using):
            release_claims(engine_id, owned, using)
            send("w", "*", using)  # peers rescan at once instead of at their next poll


def register_engine(engine_id: str, mode: str, using: str) -> None:
    now = _db_clock(using)
    Engine.objects.using(using).update_or_create(
        id=engine_id,
        defaults={
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "mode": mode,
            "started_at": now,
            "heartbeat_at": now,
            "stopped_at": None,
        },
    )


def heartbeat_engine(engine_id: str, using: str) -> None:
    Engine.objects.using(using).filter(id=engine_id).update(heartbeat_at=_db_clock(using))


def stop_engine(engine_id: str, using: str) -> None:
    Engine.objects.using(using).filter(id=engine_id).update(stopped_at=_db_clock(using))


def _db_clock(using: str):  # type: ignore[no-untyped-def]
    from ..clock import db_clock

    return db_clock(using)


def fire_delayed_starts(engine_id: str, *, limit: int, ttl: timedelta, using: str) -> dict[str, int]:
    """Start pending workflows whose delayed_start timer is due, folding the acquire into the same
    transaction (an engine-side enabling write). Any engine may do it; SKIP LOCKED splits the work.
    Lock order as everywhere: claim, then workflow, then timers."""
    from ..clock import db_now
    from ..models import Timer, Workflow
    from ..status import TimerKind, WorkflowStatus

    connection = connections[using]
    now = db_now(using)
    due = list(
        Timer.objects.using(using)
        .filter(kind=TimerKind.DELAYED_START, fire_at__lte=now)
        .order_by("fire_at")
        .values_list("workflow_id", flat=True)[:limit]
    )
    if not due:
        return {}
    started: dict[str, int] = {}
    lock = " FOR UPDATE SKIP LOCKED" if connection.vendor == "postgresql" else ""
    with transaction.atomic(using=using), connection.cursor() as cursor:
        marks = ", ".join(["%s"] * len(due))
        cursor.execute(
            f"SELECT workflow_id FROM {CLAIM_TABLE} WHERE workflow_id IN ({marks}) ORDER BY workflow_id{lock}",
            due,
        )
        locked = [row[0] for row in cursor.fetchall()]
        if not locked:
            return {}
        pending = list(
            Workflow.objects.using(using)
            .select_for_update()
            .filter(id__in=locked, status=WorkflowStatus.PENDING)
            .values_list("id", flat=True)
        )
        Workflow.objects.using(using).filter(id__in=pending).update(
            status=WorkflowStatus.RUNNING, started_at=now, updated_at=now
        )
        clock = _python_now() if connection.vendor != "postgresql" else None
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
        Timer.objects.using(using).filter(workflow_id__in=locked, kind=TimerKind.DELAYED_START).delete()
    events.claims_acquired(engine_id, started, using)
    return started


def check_mode_marker(engine_id: str, mode: str, using: str) -> None:
    """Refuse to run beside engines configured with another fencing mode: the first engine records
    its mode in a one-row marker; an engine of another mode raises OwnershipModeMismatchError.
    After stopping every engine, ``reset_mode_marker()`` allows a deliberate change of mode."""
    from ..exceptions import OwnershipModeMismatchError
    from ..models import OwnershipMarker

    with transaction.atomic(using=using):
        marker, created = (
            OwnershipMarker.objects.using(using)
            .select_for_update()
            .get_or_create(id=1, defaults={"mode": mode, "set_by": engine_id, "set_at": _db_clock(using)})
        )
    if not created and marker.mode != mode:
        raise OwnershipModeMismatchError(
            f"This database runs under OWNERSHIP={marker.mode!r} (set by engine {marker.set_by!r} at "
            f"{marker.set_at:%Y-%m-%d %H:%M:%S}), but this engine is configured with OWNERSHIP={mode!r}. "
            f"Engines with different fencing modes must not share a database. To change the mode, stop every "
            f"engine, run `python manage.py weft_engine --reset-ownership-mode`, then start them with the new setting."
        )


def reset_mode_marker(using: str) -> None:
    from ..models import OwnershipMarker

    OwnershipMarker.objects.using(using).filter(id=1).delete()


# -- "lease": one store-wide lease --------------------------------------------------------------
LEASE_TABLE = "weft_django_storelease"


def acquire_store_lease(engine_id: str, *, ttl: timedelta, renew_interval: timedelta, using: str) -> int | None:
    """Take the store-wide lease if nobody holds it or its holder's lease expired more than the grace
    ago (the same rule as a workflow claim). Returns the new lease epoch, or None."""
    connection = connections[using]
    grace = renew_interval * TAKEOVER_GRACE_MULTIPLIER
    with transaction.atomic(using=using), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"INSERT INTO {LEASE_TABLE} (id, epoch) VALUES (1, 0) ON CONFLICT (id) DO NOTHING")
            cursor.execute(
                f"""UPDATE {LEASE_TABLE} SET epoch = {next_epoch_sql("postgresql")}, engine_id = %s,
                        claimed_at = clock_timestamp(), expires_at = clock_timestamp() + %s * interval '1 millisecond'
                    WHERE id = 1 AND (engine_id IS NULL OR engine_id = %s
                        OR expires_at + %s * interval '1 millisecond' < clock_timestamp())
                    RETURNING epoch""",
                [engine_id, _ms(ttl), engine_id, _ms(grace)],
            )
            row = cursor.fetchone()
            return int(row[0]) if row else None
        now = _python_now()
        cursor.execute(f"INSERT OR IGNORE INTO {LEASE_TABLE} (id, epoch) VALUES (1, 0)")
        cursor.execute(f"SELECT engine_id, expires_at FROM {LEASE_TABLE} WHERE id = 1")
        holder, expires_at = cursor.fetchone()
        from django.utils.dateparse import parse_datetime

        expires = parse_datetime(expires_at) if isinstance(expires_at, str) else expires_at
        if holder not in (None, engine_id) and expires is not None and expires + grace >= now:
            return None
        epoch = next_epoch(using)
        cursor.execute(
            f"UPDATE {LEASE_TABLE} SET epoch = %s, engine_id = %s, claimed_at = %s, expires_at = %s WHERE id = 1",
            [epoch, engine_id, now, now + ttl],
        )
        return epoch


def renew_store_lease(engine_id: str, epoch: int, *, ttl: timedelta, using: str) -> bool:
    """Extend the lease at our epoch. False means another engine took it: we are deposed engine-wide."""
    connection = connections[using]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"UPDATE {LEASE_TABLE} SET expires_at = clock_timestamp() + %s * interval '1 millisecond' "
                f"WHERE id = 1 AND engine_id = %s AND epoch = %s",
                [_ms(ttl), engine_id, epoch],
            )
        else:
            cursor.execute(
                f"UPDATE {LEASE_TABLE} SET expires_at = %s WHERE id = 1 AND engine_id = %s AND epoch = %s",
                [_python_now() + ttl, engine_id, epoch],
            )
        return cursor.rowcount == 1


def release_store_lease(engine_id: str, epoch: int, using: str) -> None:
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {LEASE_TABLE} SET engine_id = NULL, expires_at = NULL WHERE id = 1 AND engine_id = %s "
            f"AND epoch = %s",
            [engine_id, epoch],
        )


def take_over_from_others(
    engine_id: str, *, limit: int, ttl: timedelta, using: str
) -> dict[str, tuple[int, str | None]]:
    """Take running workflows held by any other engine at once, without waiting for their claims to
    expire. Only for an engine that is the single legitimate owner: the store-lease holder, or a
    "none"-mode engine at start-up (its predecessor is presumed gone)."""
    if connections[using].vendor != "postgresql":
        return _acquire_sqlite(engine_id, _HELD_BY_OTHERS, [engine_id], limit, ttl, using)
    with transaction.atomic(using=using):
        return _claim_pg(_OTHERS_PG, [engine_id, limit], engine_id, ttl, using)


def other_live_engines(engine_id: str, *, within: timedelta, using: str) -> list[str]:
    """Engines other than this one with a recent heartbeat and no stop recorded (second-instance detection)."""
    from ..clock import db_clock

    since = db_clock(using) - within
    return list(
        Engine.objects.using(using)
        .filter(stopped_at__isnull=True, heartbeat_at__gte=since)
        .exclude(id=engine_id)
        .values_list("id", flat=True)
    )
