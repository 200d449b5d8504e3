"""Renewal of the claims an engine holds: one pass extends ``expires_at`` of every claim still held at
its epoch, skipping rows a commit holds (the commit in flight proves ownership; renewed next time),
and reports the claims a plain re-read shows lost (another epoch or holder)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction

from ..backend import backend
from ..clock import _python_now
from .holding import CHUNK, CLAIM_TABLE, _chunks, _ms, lock_claims

# Claims one renewal statement extends (PostgreSQL). Each statement locks its rows until it ends, and
# a commit meeting such a row defers (SKIP LOCKED): one statement over 500,000 claims held them ~4 s.
# Each chunk's rows are found by primary key from its ids: the holder is compared with IS NOT DISTINCT
# FROM (the same test for a non-null engine id), or the planner walks every claim the engine holds
# through weft_claim_holder for each chunk (measured at 507,000 held: 200 ms per chunk of 5,000, 28 ms
# by key).
RENEW_CHUNK = 5000


def _renew_pg(cursor: Any, ids: list[str], epochs: list[int], engine_id: str, ttl: timedelta) -> set[str]:
    cursor.execute(
        f"""WITH mine AS (
                SELECT c.workflow_id FROM {CLAIM_TABLE} c
                JOIN unnest(%s::text[], %s::bigint[]) AS o(workflow_id, epoch)
                  ON o.workflow_id = c.workflow_id AND o.epoch = c.epoch
                WHERE c.engine_id IS NOT DISTINCT FROM %s
                ORDER BY c.workflow_id FOR NO KEY UPDATE OF c SKIP LOCKED)
            UPDATE {CLAIM_TABLE} AS claim SET expires_at = clock_timestamp() + %s * interval '1 millisecond'
            FROM mine WHERE claim.workflow_id = mine.workflow_id RETURNING claim.workflow_id""",
        [ids, epochs, engine_id, _ms(ttl)],
    )
    return {row[0] for row in cursor.fetchall()}


def renew(engine_id: str, owned: dict[str, int], ttl: timedelta, using: str) -> set[str]:
    """Extend every claim still held at its epoch, skipping rows a commit holds.

    Args:
        engine_id: the holder; ``owned``: {workflow_id: epoch}; ``ttl``: the new time to live.

    Returns:
        The ids found lost (another epoch or holder on a plain re-read); rows skipped because a
        commit holds them are neither renewed nor lost.
    """
    if not owned:
        return set()
    found = backend(using)
    ids = sorted(owned)
    epochs = [owned[i] for i in ids]
    with found.connection.cursor() as cursor:
        if found.skips_locked:  # one autocommit statement per chunk: each holds its rows' locks briefly
            renewed = set()
            for at in range(0, len(ids), RENEW_CHUNK):
                renewed |= _renew_pg(cursor, ids[at : at + RENEW_CHUNK], epochs[at : at + RENEW_CHUNK], engine_id, ttl)
        else:
            with transaction.atomic(using=using):  # SQLite: one writer at a time, no row locks
                now = _python_now()
                renewed = set()
                for part in _chunks(ids, CHUNK):
                    mine = sorted(lock_claims(engine_id, {wid: owned[wid] for wid in part}, using))
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
