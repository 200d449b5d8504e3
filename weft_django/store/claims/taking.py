"""The acquire that loads what it took in the same round trip (PostgreSQL).

A plain acquire (``holding.acquire``) is one statement and the engine's load of the workflows it took
(``store/histories.py``) is a second round trip. On the path of a freshly started workflow that is two
hops before its first commit, so here both go in ONE query string: the claim statement first, then the
load's six statements, which find the ids the claim statement took in a transaction-local setting
(``weft.claimed``) it writes. A query string of several statements runs as one transaction in
PostgreSQL's simple query protocol: the claims and the reads commit together, and each read sees the
claim it follows. Nothing else changes: the same candidates (unheld, runnable, oldest first, SKIP
LOCKED), the same fresh epochs from the sequence, the same rows read as a separate load would read.

This one transaction commits without waiting for its WAL flush (``synchronous_commit`` off for it
only): it writes nothing but claims, and every durable write the engine makes under them is a fenced
commit whose own flush covers it. Why that is safe: docs/decisions/0015-acquire-without-waiting-for-the-flush.md.
Not when the caller acknowledges the claims as soon as this returns (``flush``: a ``claim_acquired``
receiver is connected): that commit waits for its flush, as every other claim's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections

from .. import prepared
from ..backend import backend
from ..histories import ADMITTED_PARAM, Loaded, client_binding, empty_loaded, load_statements, read_loaded
from .holding import CLAIM_CANDIDATES, _ms, free_candidates

# The ids the claim statement took, for the reads after it in the same transaction ('{}': none),
# through a scalar subquery: the planner does not fold it into its estimates (see _PLAN_FOR_FEW_IDS).
SETTING = "weft.claimed"
_TAKEN_IDS = f"= ANY((SELECT coalesce(nullif(current_setting('{SETTING}', true), ''), '{{}}'))::varchar[])"


def _claim_and_note(served: bool) -> str:
    """The claim statement, noting the ids it took; one row even when it took none (NULL ids)."""
    return f"""
        WITH candidates AS ({free_candidates(served)}), got AS ({CLAIM_CANDIDATES}),
        noted AS (SELECT set_config('{SETTING}', coalesce(array_agg(got.workflow_id)::text, '{{}}'), true) AS ids
                  FROM got)
        SELECT got.workflow_id, got.epoch, got.engine_id FROM noted LEFT JOIN got ON true"""


# The planner, with statistics taken while few claims were free (a burst of starts since the last
# ANALYZE: the usual case for a backlog), estimates a handful of free claims and picks a bitmap scan and
# a sort (or, on a small table, a sequential scan and a sort): every free claim read and its run probed
# before the LIMIT (10,000 free: 20 ms per acquire instead of 1). Without sorts for the claim statement
# the one plan left is the partial index weft_claim_free read in order, stopped at the LIMIT, whatever
# the statistics; the reads after it plan as configured.
_PLAN_IN_ORDER = "SET LOCAL enable_sort = off"
# The six reads are prepared without parameters, so PostgreSQL plans each ONCE per connection: they run
# with prepared.KEYED_PLAN (a plan made on an engine's first acquire over small tables had kept sequential
# scans once they had grown: one engine fell from 1,374 to 221 workflows/s, benchmarks/bulk_starts.py,
# session 10). The claim statement's enable_sort goes back to its default first.
_PLAN_FOR_FEW_IDS = ("SET LOCAL enable_sort TO DEFAULT", *prepared.KEYED_PLAN)
# docs/decisions/0015: a claim lost with an unflushed acquire (a database crash) is as if never taken.
_NO_FLUSH_WAIT = "SET LOCAL synchronous_commit = off"
# ... unless what the caller does next acknowledges the claims (a ``claim_acquired`` receiver): the
# session's own setting then (a flushed commit, as every other claim's), in the same place of the string.
_FLUSH_WAIT = "SET LOCAL synchronous_commit TO DEFAULT"
_LOADS = load_statements(_TAKEN_IDS)  # the last one (admitted updates) takes ADMITTED_PARAM
_CLAIM_ALL = _claim_and_note(False)
_CLAIM_SERVED = _claim_and_note(True)


def _statements(claim_sql: str, claim_params: list[Any], flush: bool) -> list[tuple[str, list[Any] | None]]:
    """The batch, each statement with its parameters (None: a SET, never prepared). The claim and the
    six reads are prepared once per connection (prepared.execute_statements): planning them cost
    about as much as running them (0.8 ms of the 1.7 ms of a one-workflow batch, EXPLAIN ANALYZE)."""
    loads: list[tuple[str, list[Any] | None]] = [(sql, []) for sql in _LOADS[:-1]]
    return [
        (_FLUSH_WAIT if flush else _NO_FLUSH_WAIT, None),
        (_PLAN_IN_ORDER, None),
        (claim_sql, claim_params),
        *((setting, None) for setting in _PLAN_FOR_FEW_IDS),
        *loads,
        (_LOADS[-1], [ADMITTED_PARAM]),
    ]


def available(using: str) -> bool:
    """Whether this connection can acquire and load in one round trip (PostgreSQL with psycopg 3's
    client-side binding, Django's default, outside a transaction)."""
    connection = connections[using]
    return (
        backend(using).skips_locked
        and connection.get_autocommit()
        and not connection.in_atomic_block
        and client_binding(using)
    )


def acquire_and_load(
    engine_id: str,
    *,
    limit: int,
    ttl: timedelta,
    using: str,
    served: list[str] | None = None,
    flush: bool = False,
) -> tuple[dict[str, tuple[int, str | None]], Loaded | None]:
    """Claim up to ``limit`` unheld runnable workflows (as ``holding.acquire`` without a grace) and
    read what the engine needs to drive them, in one round trip. Call only when ``available(using)``.

    Args:
        engine_id: the new holder.
        limit: at most this many claims (``<= 0``: none, nothing is sent).
        ttl: the claims' time to live.
        using: the connection alias.
        served: the queues this engine serves (None: all): unheld runs of other queues are not claimed.
        flush: wait for the commit's WAL flush (the caller acknowledges the claims once this returns:
            a ``claim_acquired`` receiver); otherwise it commits without waiting (ADR 0015).

    Returns:
        ({workflow_id: (new epoch, previous holder)}, what was read for them). The second is None if a
        row could not be converted: the claims are held all the same, and the caller loads them again
        (the loader isolates the bad row).

    Raises:
        django.db.DatabaseError: a statement failed (nothing was claimed).
    """
    if limit <= 0:
        return {}, None
    params: list[Any] = [list(served), limit] if served is not None else [limit]
    params += [engine_id, engine_id, _ms(ttl)]
    connection = connections[using]
    with connection.cursor() as cursor:
        prepared.execute_statements(
            cursor, connection, _statements(_CLAIM_SERVED if served is not None else _CLAIM_ALL, params, flush)
        )
        if not (cursor.nextset() and cursor.nextset()):  # past the two SETs: the claim statement's rows
            raise DatabaseError("the acquire-and-load batch returned no claims")
        claimed = {wid: (epoch, previous) for wid, epoch, previous in cursor.fetchall() if wid is not None}
        loaded = empty_loaded()
        try:
            if not all(cursor.nextset() for _ in range(len(_PLAN_FOR_FEW_IDS) + 1)):  # past the SETs
                raise RuntimeError("the acquire-and-load batch returned only the claims")
            read_loaded(cursor, using, loaded)
        except Exception:  # a row that cannot be converted: the caller's load finds and isolates it
            while cursor.nextset():
                pass
            return claimed, None
    return claimed, loaded
