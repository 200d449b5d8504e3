"""Claims as an engine holds them: acquire, take over, release, and the fence locks of its
commits (every claim lock in workflow_id order, in one statement, before any other write)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Count, Max

from ...models import Engine, Workflow, WorkflowClaim
from ..backend import backend
from ..clock import _python_now, offset, workflow_now_sql
from ..epochs import next_epoch, next_epoch_sql
from ..liveness import silent_params, silent_sql
from ..sessions import COMMIT_LOCK_WAIT_SQL, write_within_lock_wait

# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
#
# acquire / takeover: candidates are locked with SKIP LOCKED and rewritten with a fresh epoch only if
# they still have the exact holder and epoch that were seen: one row back means it is ours. Every
# statement that makes an engine the holder sets last_engine_id to it too (a release keeps it), so a
# claim still names the engine that last took it after the run ended.
# renew (renewal.py): statements of RENEW_CHUNK claims, skipping rows a transaction holds more than
# PLAIN_LOCK_WAIT_MS (the commit in flight proves ownership; retried next tick). A claim is lost
# only when a plain re-read shows another epoch or holder.

CLAIM_TABLE = WorkflowClaim._meta.db_table
ENGINE_TABLE = Engine._meta.db_table
WORKFLOW_TABLE = Workflow._meta.db_table
CHUNK = 500


def _ms(delta: timedelta) -> int:
    return round(delta.total_seconds() * 1000)


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# The claimable runs, oldest first: unheld claims of running workflows. They are read in order from
# the partial index weft_claim_free on run_created_at (unheld AND runnable: not held elsewhere, not
# the released claims of finished runs, which stay until retention), each one's workflow row probed
# by key, until the batch is full: the work is bounded by the batch, not by the running or finished
# workflows, whatever the planner's statistics. (The probe's LIMIT keeps it a parameterised lookup
# by key: filters on status inside it would let the planner pick a status index and loop over it.)
#
# An engine that serves only some queues (``weft_engine --queues``) reads them with SERVED_ONLY: a run
# of another queue (the next run of a continued queued workflow, one released at a shutdown) is left to
# the engines serving it; runs without a queue stay everyone's. Takeover is not filtered.
SERVED_ONLY = "(w.queue IS NULL OR w.queue = ANY(%s))"


def _free_pg(served: bool) -> str:
    queues = f" AND {SERVED_ONLY}" if served else ""
    return f"""
    SELECT c.workflow_id, c.epoch, c.engine_id
    FROM {CLAIM_TABLE} c CROSS JOIN LATERAL (
        SELECT w.status, w.stuck_retry_at, w.queue FROM {WORKFLOW_TABLE} w WHERE w.id = c.workflow_id LIMIT 1) w
    WHERE c.engine_id IS NULL AND c.runnable AND w.status = 'running'
      AND (w.stuck_retry_at IS NULL OR w.stuck_retry_at <= {workflow_now_sql("postgresql")}){queues}
    ORDER BY c.run_created_at
    LIMIT %s
    FOR NO KEY UPDATE OF c SKIP LOCKED"""


_FREE_PG = _free_pg(False)
_FREE_SERVED_PG = _free_pg(True)


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


# Takeover candidates (constant SQL: the conditions take their values as parameters). A held claim has
# lapsed when its expiry is more than the grace past, or, for a claim renewed as dormant (its expiry more
# than one TTL ahead), when its holder's heartbeat is no evidence of life: more than the TTL and the grace
# past (the expiry a claim renewed at that heartbeat would have), or as far ahead (a hand edit,
# 'infinity': store/liveness.py, the one rule for every reader of heartbeats): an engine renews the
# claims of its evicted workflows rarely (engine/renewal.py, "dormant" claims, ADR 0014), and its
# heartbeat is what keeps them. A claim
# renewed with the TTL is kept by its expiry alone: a heartbeat skipped behind a locked engine row (a
# user's transaction) must not take the claims a live engine keeps renewing (its renewal renews its
# dormant claims with the TTL meanwhile). A holder with no engine row has no heartbeat to keep such a
# claim (a hand edit, a row copied from another database: 'infinity' never expires), so it lapses as
# one whose heartbeat is old; a live engine whose row was deleted fails its heartbeat and renews every
# claim with the TTL. The lapsed and the registered holders are read once per statement (InitPlans over
# the few engine rows), not once per claim.
_HELD_BY_OTHERS = "c.engine_id IS NOT NULL AND c.engine_id <> %s"
_LAPSED_PG = (
    "(c.expires_at + %s * interval '1 millisecond' < clock_timestamp() OR ("
    "c.expires_at > clock_timestamp() + %s * interval '1 millisecond' AND (c.engine_id = ANY(ARRAY("
    f"SELECT e.id FROM {ENGINE_TABLE} e WHERE {silent_sql('e.heartbeat_at', 'postgresql')})) "
    f"OR c.engine_id <> ALL(ARRAY(SELECT e.id FROM {ENGINE_TABLE} e)))))"
)
_EXPIRED_PG = _held_pg(f"c.engine_id IS NOT NULL AND {_LAPSED_PG}")
_OTHERS_PG = _held_pg(_HELD_BY_OTHERS)
# The same among the claims of the given holders only (read through the partial index on the holder:
# the claims of live engines, however many, are not read).
_EXPIRED_OF_PG = _held_pg(f"c.engine_id = ANY(%s) AND {_LAPSED_PG}")
# Where one writer runs (SQLite): the same rule, its times computed by the caller.
_LAPSED_ONE_WRITER = (
    f"c.engine_id IS NOT NULL AND (c.expires_at < %s OR (c.expires_at > %s AND (c.engine_id IN "
    f"(SELECT e.id FROM {ENGINE_TABLE} e WHERE {silent_sql('e.heartbeat_at', 'sqlite')}) "
    f"OR c.engine_id NOT IN (SELECT e.id FROM {ENGINE_TABLE} e))))"
)


# Give the rows of the CTE ``candidates`` this holder and a fresh epoch (parameters: the engine id twice,
# the TTL in ms); returns (workflow id, new epoch, previous holder). Shared by the plain acquire and the
# acquire that loads in the same round trip (store/claims/taking.py).
CLAIM_CANDIDATES = f"""
    UPDATE {CLAIM_TABLE} AS claim
    SET epoch = {next_epoch_sql("postgresql")}, engine_id = %s, last_engine_id = %s,
        claimed_at = clock_timestamp(), expires_at = clock_timestamp() + %s * interval '1 millisecond'
    FROM candidates
    WHERE claim.workflow_id = candidates.workflow_id AND claim.epoch = candidates.epoch
      AND claim.engine_id IS NOT DISTINCT FROM candidates.engine_id
    RETURNING claim.workflow_id, claim.epoch, candidates.engine_id"""


def free_candidates(served: bool) -> str:
    """The candidates of a plain acquire (PostgreSQL): unheld runnable claims, oldest first, SKIP
    LOCKED; parameters: (the served queues when ``served``,) the limit."""
    return _FREE_SERVED_PG if served else _FREE_PG


def _claim_pg(
    candidates: str, params: list[Any], engine_id: str, ttl: timedelta, using: str
) -> dict[str, tuple[int, str | None]]:
    """Lock the candidates (SKIP LOCKED) and give each a fresh epoch and this holder (also recorded as
    the claim's last holder), only if it still has the holder and epoch seen: one row back means it is
    ours. One statement: in autocommit it is its own transaction (no BEGIN/COMMIT round trips)."""
    sql = f"WITH candidates AS ({candidates}) {CLAIM_CANDIDATES}"
    with backend(using).connection.cursor() as cursor:
        cursor.execute(sql, [*params, engine_id, engine_id, _ms(ttl)])
        return {wid: (epoch, previous) for wid, epoch, previous in cursor.fetchall()}


def acquire(
    engine_id: str,
    *,
    limit: int,
    ttl: timedelta,
    using: str,
    grace: timedelta | None = None,
    holders: list[str] | None = None,
    served: list[str] | None = None,
) -> dict[str, tuple[int, str | None]]:
    """Claim up to ``limit`` running workflows that no engine holds (or, with ``grace``, whose claim
    lapsed: it expired more than ``grace`` ago, or its holder's heartbeat is more than ``ttl`` +
    ``grace`` old, or as far ahead; a takeover), oldest first, SKIP LOCKED.

    Args:
        engine_id: the new holder.
        limit: at most this many claims (``<= 0``: none).
        ttl: the claims' time to live.
        using: the connection alias.
        grace: None for unheld claims; else how long past expiry (or, for a claim whose expiry is more
            than ``ttl`` ahead, a dormant one, past its holder's heartbeat and ``ttl``) a held claim may
            be taken over.
        holders: with ``grace`` on PostgreSQL, only the claims of these engines are looked at (None:
            every held claim; elsewhere every held claim anyway).
        served: without ``grace``, the queues this engine serves (None: all): unheld runs of other
            queues are not claimed (runs without a queue are).

    Returns:
        {workflow_id: (new epoch, previous holder)}.
    """
    if limit <= 0:
        return {}
    if backend(using).skips_locked:
        if grace is None:
            if served is not None:
                return _claim_pg(_FREE_SERVED_PG, [list(served), limit], engine_id, ttl, using)
            return _claim_pg(_FREE_PG, [limit], engine_id, ttl, using)
        lapsed = [_ms(grace), _ms(ttl), *silent_params(ttl + grace, using)]
        if holders is not None:
            return _claim_pg(_EXPIRED_OF_PG, [holders, *lapsed, limit], engine_id, ttl, using)
        return _claim_pg(_EXPIRED_PG, [*lapsed, limit], engine_id, ttl, using)
    if grace is not None:
        now = _python_now()
        # heartbeat_at is written by the ORM (naive, in the connection's time zone): compared as the ORM
        # would write these instants (silent_params); the claims' expiry is written by this module's raw
        # statements.
        beats = silent_params(ttl + grace, using, now)
        return _acquire_one_writer(engine_id, _LAPSED_ONE_WRITER, [now - grace, now + ttl, *beats], limit, ttl, using)
    return _acquire_one_writer(engine_id, None, [], limit, ttl, using, served=served)


def take_over(engine_id: str, *, limit: int, ttl: timedelta, using: str) -> dict[str, tuple[int, str | None]]:
    """Take up to ``limit`` running workflows held by any other engine at once, without waiting for
    their claims to expire. Returns {workflow_id: (new epoch, previous holder)}.

    Args:
        engine_id: the new holder; ``limit``, ``ttl``, ``using``: as for :func:`acquire`.
    """
    if not backend(using).skips_locked:
        return _acquire_one_writer(engine_id, _HELD_BY_OTHERS, [engine_id], limit, ttl, using)
    with transaction.atomic(using=using):
        return _claim_pg(_OTHERS_PG, [engine_id, limit], engine_id, ttl, using)


def _acquire_one_writer(
    engine_id: str,
    holder: str | None,
    params: list[Any],
    limit: int,
    ttl: timedelta,
    using: str,
    *,
    served: list[str] | None = None,
) -> dict[str, tuple[int, str | None]]:
    """Where the database has one writer (SQLite): ``holder`` is the condition on held claims
    (takeover), or None for the unheld runnable ones, read in order from the partial index
    weft_claim_free (CROSS JOIN keeps SQLite's join order: claims first, each workflow looked up by key);
    ``served``: for those, the queues this engine serves (None: all; runs without a queue always)."""
    # One writer at a time (IMMEDIATE): what we read inside the transaction stays true until commit.
    now = _python_now()
    wf_now = now + offset(using)
    if holder is None:
        source = f"{CLAIM_TABLE} c CROSS JOIN {WORKFLOW_TABLE} w ON w.id = c.workflow_id"
        holder, order = "c.engine_id IS NULL AND c.runnable", "c.run_created_at"
        if served is not None:
            names = list(served) or [""]  # no queue is named "" (validated): none served, only runs without one
            marks = ", ".join(["%s"] * len(names))
            holder = f"{holder} AND (w.queue IS NULL OR w.queue IN ({marks}))"
            params = [*names, *params]
    else:
        source, order = f"{CLAIM_TABLE} c JOIN {WORKFLOW_TABLE} w ON w.id = c.workflow_id", "w.created_at"
    claimed: dict[str, tuple[int, str | None]] = {}
    with transaction.atomic(using=using), backend(using).connection.cursor() as cursor:
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


# A release (shutdown, runs found ended at load), one statement per chunk: our claims at their epochs,
# locked in workflow_id order, cleared. A row another transaction holds past COMMIT_LOCK_WAIT_MS (a user's
# open transaction) is then skipped and left to expire: waiting out the session's lock_timeout rolled
# every claim of the release back.
_RELEASE_PG = (
    f"WITH mine AS (SELECT c.workflow_id FROM {CLAIM_TABLE} c JOIN unnest(%s::text[], %s::bigint[]) AS "
    "o(workflow_id, epoch) ON o.workflow_id = c.workflow_id AND o.epoch = c.epoch WHERE c.engine_id = %s "
    "ORDER BY c.workflow_id FOR NO KEY UPDATE OF c{skip}) UPDATE " + CLAIM_TABLE + " AS claim SET "
    "engine_id = NULL, claimed_at = NULL, expires_at = NULL FROM mine WHERE claim.workflow_id = mine.workflow_id"
)


def release_claims(engine_id: str, epochs: dict[str, int], using: str) -> None:
    """Clear the holder, keep the epoch, where the claim is still ours at that epoch (``epochs``:
    {workflow_id: epoch}); a claim row another transaction holds (``_RELEASE_PG``) stays held."""
    found = backend(using)
    with found.connection.cursor() as cursor:
        for chunk in _chunks(sorted(epochs), CHUNK if found.skips_locked else 1):
            if not found.skips_locked:  # one writer: nothing to wait for
                sql = f"UPDATE {CLAIM_TABLE} SET engine_id = NULL, claimed_at = NULL, expires_at = NULL WHERE "
                cursor.execute(
                    f"{sql}workflow_id = %s AND epoch = %s AND engine_id = %s", [*chunk, epochs[chunk[0]], engine_id]
                )
                continue
            params = [chunk, [epochs[wid] for wid in chunk], engine_id]
            if not write_within_lock_wait(cursor, _RELEASE_PG.format(skip=""), params, using):
                cursor.execute(_RELEASE_PG.format(skip=" SKIP LOCKED"), params)


def release_locked_claims(engine_id: str, workflow_ids: list[str], using: str, *, ended: list[str]) -> None:
    """Clear the holder, keep the epoch, for claims this transaction has locked at our epochs (the
    fence already proved them ours): one statement per chunk.

    Args:
        engine_id: the holder; ``workflow_ids``: the claims to release.
        ended: runs that ended: their claims are no longer runnable (out of acquire's partial index).
    """
    done = set(ended)
    with backend(using).connection.cursor() as cursor:
        for runnable in (True, False):
            chosen = sorted(wid for wid in workflow_ids if (wid not in done) == runnable)
            for chunk in _chunks(chosen, CHUNK):
                marks = ", ".join(["%s"] * len(chunk))
                cursor.execute(
                    f"UPDATE {CLAIM_TABLE} SET engine_id = NULL, claimed_at = NULL, expires_at = NULL, "
                    f"runnable = %s WHERE engine_id = %s AND workflow_id IN ({marks})",
                    [runnable, engine_id, *chunk],
                )


# The claim parts of the one-statement commit (store/commit_statement.py composes them into its
# statement). The fence ``f``: our claims at the epochs of the document ``raw``'s ``f`` list, locked in
# workflow_id order, skipping rows another transaction holds.
# The rows are found by primary key (the ``ANY`` of the listed ids); the holder is compared with IS
# NOT DISTINCT FROM (the same test for a non-null engine id) so that the plan never walks every claim
# the engine holds through weft_claim_holder (the generic plan chose it: 0.2-0.3 ms per statement
# for an engine holding 1,000 claims, on every fenced commit).
FENCE_CTE = (
    f"f AS MATERIALIZED (SELECT c.workflow_id FROM {CLAIM_TABLE} c WHERE "
    "c.workflow_id = ANY(ARRAY(SELECT x->>0 FROM raw, jsonb_array_elements(raw.j->'f') x)) "
    "AND c.engine_id IS NOT DISTINCT FROM %s "
    "AND (c.workflow_id, c.epoch) IN (SELECT x->>0, (x->>1)::bigint FROM raw, jsonb_array_elements(raw.j->'f') x) "
    "ORDER BY c.workflow_id FOR NO KEY UPDATE SKIP LOCKED)"
)


def release_cte_sql(ids: str, runnable: str) -> str:
    """The release CTE of the one-statement commit: clear the holder (epoch kept) of our claims among
    the SQL array ``ids``, which the statement's fence locked; ``runnable``: the SQL of the new runnable
    flag. Takes one parameter, the engine id (never null). Found by primary key, as ``FENCE_CTE``."""
    return (
        f"released AS (UPDATE {CLAIM_TABLE} SET engine_id = NULL, claimed_at = NULL, expires_at = NULL, "
        f"runnable = {runnable} WHERE workflow_id = ANY({ids}) AND engine_id IS NOT DISTINCT FROM %s)"
    )


def _past_lock_wait(cursor: Any, bounded: bool) -> None:
    """After a lock statement sent behind COMMIT_LOCK_WAIT_SQL (``bounded``): move to its rows."""
    if bounded and not cursor.nextset():
        raise DatabaseError("the claim lock returned no rows")


def lock_claims(
    engine_id: str, epochs: dict[str, int], using: str, *, wait: bool = True, bounded: bool = False
) -> set[str]:
    """Inside a transaction: lock the claims still held at these epochs; return their workflow ids.

    ``wait=False`` (the engine's batch commits): a claim row another transaction has locked (a user's
    open transaction around ``cancel()``, a takeover, our own renewal) is skipped, not waited for; its
    workflow is not in the result, and :func:`classify_unheld` tells it apart from a lost claim.

    Args:
        engine_id: the holder; ``epochs``: {workflow_id: epoch}; ``using``: the connection alias.
        bounded: send the fenced commit's ``SET LOCAL lock_timeout`` (COMMIT_LOCK_WAIT_SQL) ahead of
            the lock, in the same round trip.
    """
    ids = sorted(epochs)
    if not ids:
        return set()
    found = backend(using)
    lock = found.lock_sql(no_key=True, skip_locked=not wait)
    held: set[str] = set()
    with found.connection.cursor() as cursor:
        for chunk in _chunks(ids, CHUNK):
            placeholders = ", ".join(["%s"] * len(chunk))
            wait_bound = f"{COMMIT_LOCK_WAIT_SQL};\n" if bounded else ""
            cursor.execute(
                f"{wait_bound}SELECT workflow_id, epoch FROM {CLAIM_TABLE} WHERE engine_id = %s AND workflow_id IN "
                f"({placeholders}) ORDER BY workflow_id{lock}",
                [engine_id, *chunk],
            )
            _past_lock_wait(cursor, bounded)
            bounded = False
            held.update(wid for wid, epoch in cursor.fetchall() if epochs[wid] == epoch)
    return held


def lock_batch_and_family(
    engine_id: str, epochs: dict[str, int], family: set[str], using: str, *, bounded: bool = False
) -> tuple[set[str], set[str]]:
    """Inside a transaction, ONE statement in workflow_id order (one per chunk past the database's
    parameter limit, ``Backend.chunks``, still in that order): lock our claims at these epochs and
    the claims of ``family`` (the active descendants that finishing runs close, whoever holds them),
    skipping rows another transaction holds. ``bounded``: as :func:`lock_claims`'s.

    Returns:
        (our claims held, family claims locked).
    """
    ids = sorted(set(epochs) | family)
    if not ids:
        return set(), set()
    found = backend(using)
    lock = found.lock_sql(no_key=True, skip_locked=True)
    rows: list[tuple[str, int, str | None]] = []
    with found.connection.cursor() as cursor:
        for chunk in found.chunks(ids):  # one statement unless the ids pass the database's parameter limit
            placeholders = ", ".join(["%s"] * len(chunk))
            wait_bound = f"{COMMIT_LOCK_WAIT_SQL};\n" if bounded else ""
            cursor.execute(
                f"{wait_bound}SELECT workflow_id, epoch, engine_id FROM {CLAIM_TABLE} WHERE workflow_id IN "
                f"({placeholders}) ORDER BY workflow_id{lock}",
                chunk,
            )
            _past_lock_wait(cursor, bounded)
            bounded = False
            rows += cursor.fetchall()
    held = {wid for wid, epoch, holder in rows if wid in epochs and (epoch, holder) == (epochs[wid], engine_id)}
    return held, {wid for wid, _, _ in rows if wid in family}


def lock_ids(workflow_ids: list[str], using: str, *, wait: bool = True) -> set[str]:
    """Inside a transaction, ONE statement in workflow_id order (one per chunk past the database's
    parameter limit, ``Backend.chunks``, still in that order): lock these claims whoever holds them
    (``wait=False``: skip rows another transaction holds). Returns the ids locked.

    Args:
        workflow_ids: the claims to lock; ``using``: the connection alias.
    """
    ids = sorted(set(workflow_ids))
    if not ids:
        return set()
    found = backend(using)
    lock = found.lock_sql(no_key=True, skip_locked=not wait)
    locked: set[str] = set()
    with found.connection.cursor() as cursor:
        for chunk in found.chunks(ids):
            placeholders = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"SELECT workflow_id FROM {CLAIM_TABLE} WHERE workflow_id IN ({placeholders}) "
                f"ORDER BY workflow_id{lock}",
                chunk,
            )
            locked.update(row[0] for row in cursor.fetchall())
    return locked


def lock_at_epochs(epochs: dict[str, int], using: str, *, wait: bool = True) -> set[str]:
    """Inside a transaction, in workflow_id order: lock the claims still at these epochs while SOME
    engine holds them (a Celery worker's outcome: the worker holds no claim). Returns the ids locked.

    Args:
        epochs: {workflow_id: epoch}; ``using``: the connection alias.
        wait: False skips rows another transaction holds.
    """
    ids = sorted(epochs)
    if not ids:
        return set()
    found = backend(using)
    lock = found.lock_sql(no_key=True, skip_locked=not wait)
    locked: set[str] = set()
    # ONE statement in workflow_id order (the global lock order); one per chunk, in that order, past the
    # database's parameter limit.
    with found.connection.cursor() as cursor:
        for chunk in found.chunks(ids, per_item=2):
            placeholders = ", ".join(["%s"] * len(chunk))
            # Epochs come from one global sequence (ADR 0002): the two IN lists match the (workflow_id, epoch)
            # pairs asked for, and a row locked for another pair (an epoch handed out again after a database
            # crash lost an unflushed acquire, ADR 0015) is filtered out below.
            cursor.execute(
                f"SELECT workflow_id, epoch FROM {CLAIM_TABLE} WHERE workflow_id IN ({placeholders}) "
                f"AND epoch IN ({placeholders}) AND engine_id IS NOT NULL ORDER BY workflow_id{lock}",
                [*chunk, *(epochs[wid] for wid in chunk)],
            )
            locked.update(wid for wid, epoch in cursor.fetchall() if epochs.get(wid) == epoch)
    return locked


def previous_holding(engine_id: str, using: str) -> tuple[int, datetime | None]:
    """How many claims ``engine_id`` holds now and the latest of their expiries (an engine at start-up:
    claims a previous process with its id left behind)."""
    found = (
        WorkflowClaim.objects.using(using)
        .filter(engine_id=engine_id)
        .aggregate(n=Count("pk"), latest=Max("expires_at"))
    )
    return int(found["n"]), found["latest"]


def classify_unheld(engine_id: str, epochs: dict[str, int], using: str) -> tuple[dict[str, str], set[str]]:
    """For claims a fence did not get: (lost, busy).

    Returns:
        ``lost`` maps a workflow id to "deposed", "released" or "missing"; ``busy`` holds those still
        ours at our epoch, whose row another transaction had locked (their writes wait for the next pass).
    """
    if not epochs:
        return {}, set()
    ids = sorted(epochs)
    rows = {wid: (holder, epoch) for wid, holder, epoch in _claim_rows("workflow_id, engine_id, epoch", ids, using)}
    lost: dict[str, str] = {}
    busy: set[str] = set()
    for wid in ids:
        if wid not in rows:
            lost[wid] = "missing"
        elif rows[wid] == (engine_id, epochs[wid]):
            busy.add(wid)
        else:
            lost[wid] = "released" if rows[wid][0] is None else "deposed"
    return lost, busy


def _claim_rows(columns: str, workflow_ids: list[str], using: str) -> list[tuple[Any, ...]]:
    """``columns`` of these workflows' claim rows (a plain read), in statements the backend's parameter
    limit allows (``Backend.chunks``)."""
    found, rows = backend(using), []
    with found.connection.cursor() as cursor:
        for chunk in found.chunks(workflow_ids):
            placeholders = ", ".join(["%s"] * len(chunk))
            cursor.execute(f"SELECT {columns} FROM {CLAIM_TABLE} WHERE workflow_id IN ({placeholders})", chunk)
            rows.extend(cursor.fetchall())
    return rows


def why_lost(engine_id: str, workflow_ids: list[str], using: str) -> dict[str, str]:
    """Why these claims are not ours: {workflow_id: "missing" | "released" | "deposed"}."""
    rows: dict[str, str | None] = dict(_claim_rows("workflow_id, engine_id", workflow_ids, using))
    return {
        wid: "missing" if wid not in rows else ("released" if rows[wid] is None else "deposed") for wid in workflow_ids
    }


def holders(workflow_ids: set[str], using: str) -> dict[str, tuple[int, str | None]]:
    """A plain read (no lock): {workflow_id: (epoch, holder)} of these claims."""
    rows = WorkflowClaim.objects.using(using)
    return {
        wid: (epoch, holder)
        for chunk in backend(using).chunks(sorted(workflow_ids))
        for wid, epoch, holder in rows.filter(workflow_id__in=chunk).values_list("workflow_id", "epoch", "engine_id")
    }


def holder(workflow_id: str, using: str) -> tuple[int, str | None] | None:
    """A plain read (no lock): (epoch, holder) of one claim, or None if it does not exist."""
    row: tuple[int, str | None] | None = (
        WorkflowClaim.objects.using(using).filter(pk=workflow_id).values_list("epoch", "engine_id").first()
    )
    return row


def insert_unheld_many(rows: list[tuple[str, int, bool]], run_created_at: datetime, using: str) -> None:
    """``insert_unheld`` of many runs at once: (workflow id, epoch, runnable) each.

    Raises:
        django.db.IntegrityError: a workflow already has a claim.
    """
    WorkflowClaim.objects.using(using).bulk_create(
        [
            WorkflowClaim(workflow_id=wid, epoch=epoch, run_created_at=run_created_at, runnable=runnable)
            for wid, epoch, runnable in rows
        ]
    )


def insert_unheld(workflow_id: str, epoch: int, run_created_at: datetime, using: str, *, runnable: bool = True) -> None:
    """Insert the unheld claim of a new run (a child) at ``epoch``; ``runnable=False`` for a run
    waiting in a queue (its admission makes it runnable, ``hold_admitted``).

    Raises:
        django.db.IntegrityError: the workflow already has a claim.
    """
    WorkflowClaim.objects.using(using).create(
        workflow_id=workflow_id, epoch=epoch, run_created_at=run_created_at, runnable=runnable
    )
