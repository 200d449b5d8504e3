"""Server-side bounds on the engine's own PostgreSQL sessions, so a frozen engine lets go of its locks.

An engine stopped while one of its sessions is inside a transaction (SIGSTOP, a VM pause, a debugger, a
swap storm) keeps that transaction's row locks for as long as it stays frozen: its socket is still open,
so PostgreSQL never ends the session, and peers' takeover (``FOR NO KEY UPDATE ... SKIP LOCKED``) skips
exactly the claims it locked. The engine loop's and the renewal thread's sessions therefore run with
``idle_in_transaction_session_timeout`` below the claim TTL (half of it, at least 1 s): PostgreSQL ends
such a session and rolls its transaction back, and the claims expire and are taken over as after a
crash. ``lock_timeout`` is set to the same bound, so the engine itself never waits longer than that
behind a session that does not let go (it gets an error, logs it and retries).

Activity threads keep PostgreSQL's defaults: an ``atomic=True`` activity may legitimately sit in its
transaction for longer than the TTL. Only once the user's function has returned, right before the
claim row is locked, does its transaction get the same bound (``SET LOCAL``, this transaction only).

This module holds the policy (``session_limit``); the statements, ``bind``/``unbind`` and the
per-thread bookkeeping are in ``weft_django.store.sessions``. SQLite has no sessions to bound:
everything there is a no-op.
"""

from __future__ import annotations

from datetime import timedelta

from ..conf import WeftSettings
from ..status import OwnershipMode

MIN_LIMIT = timedelta(seconds=1)


def session_limit(settings: WeftSettings) -> timedelta:
    """How long an engine session may sit idle in a transaction or wait for a lock: half the claim TTL
    (half the store lease's, if shorter, in LEASE mode), at least 1 s.

    Args:
        settings: the engine's settings.
    """
    ttl = settings.workflow_claim_ttl
    if settings.ownership == OwnershipMode.LEASE:
        ttl = min(ttl, settings.lease_ttl)
    return max(ttl / 2, MIN_LIMIT)


__all__ = ["MIN_LIMIT", "session_limit"]
