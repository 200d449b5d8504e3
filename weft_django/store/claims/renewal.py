"""Renewal of the claims an engine holds: one pass extends ``expires_at`` of every claim still held at
its epoch, never waiting long for rows a commit holds (such a row is skipped: the commit in flight
proves ownership; renewed next time), and reports the claims a plain re-read shows lost (another
epoch or holder)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import OperationalError, transaction

from ..backend import backend
from ..clock import _python_now
from ..sessions import lock_wait_ended
from .holding import CHUNK, CLAIM_TABLE, _chunks, _ms, lock_claims

# Claims one renewal statement extends (PostgreSQL). Each statement locks its rows until it ends, and
# a commit meeting such a row defers (SKIP LOCKED): one statement over 500,000 claims held them ~4 s.
# Each chunk's rows are found by primary key from its ids: the holder is compared with IS NOT DISTINCT
# FROM (the same test for a non-null engine id), or the planner walks every claim the engine holds
# through weft_claim_holder for each chunk (measured at 507,000 held: 200 ms per chunk of 5,000, 28 ms
# by key).
RENEW_CHUNK = 5000
# How long a chunk's plain UPDATE may wait for a row another transaction holds before it gives up and
# the chunk is renewed again skipping locked rows: a commit in flight holds a claim for about a
# millisecond; a user's open transaction, for as long as it likes.
PLAIN_LOCK_WAIT_MS = 10

_EXTEND = "expires_at = clock_timestamp() + %s * interval '1 millisecond'"
# The usual form: one UPDATE, no row lock taken beforehand. Measured on 500,000 claims in chunks of
# 5,000 (docs/benchmarks.md, issue 16 session 14): 4.1 s and 44 MB of WAL, against 6.1 s and 68 MB for
# the form that locks first (each row locked, then updated: two heap changes and two WAL records).
_PLAIN = f"""UPDATE {CLAIM_TABLE} AS c SET {_EXTEND}
    FROM unnest(%s::text[], %s::bigint[]) AS o(workflow_id, epoch)
    WHERE o.workflow_id = c.workflow_id AND o.epoch = c.epoch AND c.engine_id IS NOT DISTINCT FROM %s
    RETURNING c.workflow_id"""
# The form that never waits: the rows a commit (or a user's transaction) holds are skipped.
_SKIPPING = f"""WITH mine AS (
        SELECT c.workflow_id FROM {CLAIM_TABLE} c
        JOIN unnest(%s::text[], %s::bigint[]) AS o(workflow_id, epoch)
          ON o.workflow_id = c.workflow_id AND o.epoch = c.epoch
        WHERE c.engine_id IS NOT DISTINCT FROM %s
        ORDER BY c.workflow_id FOR NO KEY UPDATE OF c SKIP LOCKED)
    UPDATE {CLAIM_TABLE} AS claim SET {_EXTEND}
    FROM mine WHERE claim.workflow_id = mine.workflow_id RETURNING claim.workflow_id"""
# A renewal's commit need not wait for the disk: one lost in a crash of PostgreSQL is a renewal that did
# not happen, which the claim's TTL (at least three renew intervals) allows for.
_PLAIN_SETTINGS = "SELECT set_config('lock_timeout', %s, true), set_config('synchronous_commit', 'off', true)"


@dataclass
class RenewalPass:
    """What one renewal pass has learned, carried across its calls of :func:`renew_each` (the engine
    renews in groups, one call each): ``plain`` turns False once a statement gave up waiting for a held
    row, and the pass's later statements then skip held rows at once."""

    plain: bool = True


def _renew_pg(
    cursor: Any, ids: list[str], epochs: list[int], engine_id: str, ttl: timedelta, using: str, *, plain: bool
) -> tuple[set[str], bool]:
    """One chunk: with ``plain``, the plain UPDATE, waiting at most PLAIN_LOCK_WAIT_MS for a row another
    transaction holds; if it had to wait longer (its transaction rolled back), or without ``plain``, the
    same chunk skipping locked rows. Inside a caller's transaction only the latter (its settings would
    outlive the chunk). Returns (the ids renewed, whether the plain form may be tried next): a row held
    past the wait is likely a user's open transaction, so the pass's later chunks skip at once rather
    than wait PLAIN_LOCK_WAIT_MS each."""
    if plain and not transaction.get_connection(using).in_atomic_block:
        try:
            with transaction.atomic(using=using):
                cursor.execute(_PLAIN_SETTINGS, [str(PLAIN_LOCK_WAIT_MS)])
                cursor.execute(_PLAIN, [_ms(ttl), ids, epochs, engine_id])
                return {row[0] for row in cursor.fetchall()}, True
        except OperationalError as exc:
            if not lock_wait_ended(exc):
                raise
    cursor.execute(_SKIPPING, [ids, epochs, engine_id, _ms(ttl)])
    return {row[0] for row in cursor.fetchall()}, False


def renew(engine_id: str, owned: dict[str, int], ttl: timedelta, using: str) -> set[str]:
    """Extend every claim still held at its epoch; a row another transaction holds more than
    PLAIN_LOCK_WAIT_MS is skipped (renewed next time).

    Args:
        engine_id: the holder; ``owned``: {workflow_id: epoch}; ``ttl``: the new time to live.

    Returns:
        The ids found lost (another epoch or holder on a plain re-read); rows skipped because a
        commit holds them are neither renewed nor lost.
    """
    return renew_each(engine_id, owned, ttl, using)[1]


def renew_each(
    engine_id: str, owned: dict[str, int], ttl: timedelta, using: str, *, each_pass: RenewalPass | None = None
) -> tuple[set[str], set[str]]:
    """:func:`renew`, saying which claims it renewed. Returns (the ids renewed, the ids found lost):
    an id in neither was skipped (a transaction held its row). ``each_pass``: the pass this call is
    part of (None: a pass of its own)."""
    each_pass = each_pass if each_pass is not None else RenewalPass()
    if not owned:
        return set(), set()
    found = backend(using)
    ids = sorted(owned)
    epochs = [owned[i] for i in ids]
    with found.connection.cursor() as cursor:
        if found.skips_locked:  # one short transaction per chunk: each holds its rows' locks briefly
            renewed = set()
            for at in range(0, len(ids), RENEW_CHUNK):
                part, part_epochs = ids[at : at + RENEW_CHUNK], epochs[at : at + RENEW_CHUNK]
                done, each_pass.plain = _renew_pg(
                    cursor, part, part_epochs, engine_id, ttl, using, plain=each_pass.plain
                )
                renewed |= done
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
            return renewed, set()
        current: dict[str, tuple[int, str | None]] = {}
        for chunk in found.chunks(missing):  # every claim lost at once: past the database's parameter limit
            marks = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"SELECT workflow_id, epoch, engine_id FROM {CLAIM_TABLE} WHERE workflow_id IN ({marks})", chunk
            )
            current.update((wid, (epoch, holder)) for wid, epoch, holder in cursor.fetchall())
    return renewed, {wid for wid in missing if current.get(wid) != (owned[wid], engine_id)}
