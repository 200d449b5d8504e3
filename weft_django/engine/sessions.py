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

A thread opts in with ``bind`` (its current connection gets the settings now, every new connection of
that thread gets them in ``connection_created``), and ``unbind`` restores the defaults. SQLite has no
sessions to bound: everything here is a no-op there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.dispatch import receiver

from ..conf import WeftSettings
from ..status import OwnershipMode

P = ParamSpec("P")
R = TypeVar("R")

MIN_LIMIT = timedelta(seconds=1)

_bound = threading.local()  # .limits: {database alias: limit in ms} for the engine's threads


def session_limit(settings: WeftSettings) -> timedelta:
    """How long an engine session may sit idle in a transaction or wait for a lock: half the claim TTL
    (half the store lease's, if shorter, in LEASE mode), at least 1 s."""
    ttl = settings.workflow_claim_ttl
    if settings.ownership == OwnershipMode.LEASE:
        ttl = min(ttl, settings.lease_ttl)
    return max(ttl / 2, MIN_LIMIT)


def _ms(limit: timedelta) -> str:
    return str(int(limit.total_seconds() * 1000))


def _apply(connection: BaseDatabaseWrapper, limit_ms: str) -> None:
    # set_config() takes parameters under client- and server-side binding alike (SET does not).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false), "
            "set_config('lock_timeout', %s, false)",
            [limit_ms, limit_ms],
        )


def _limits() -> dict[str, str]:
    limits: dict[str, str] | None = getattr(_bound, "limits", None)
    if limits is None:
        limits = _bound.limits = {}
    return limits


def bind(using: str, limit: timedelta) -> None:
    """Bound this thread's sessions on ``using``, now and after every reconnect. Not when the thread is
    inside someone's transaction (an engine driven from a test's atomic block): that transaction
    belongs to its caller."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return
    _limits()[using] = _ms(limit)
    if connection.connection is not None:
        _apply(connection, _limits()[using])


def unbind(using: str) -> None:
    """Give this thread's connection the server's defaults back (it may serve other code afterwards)."""
    if _limits().pop(using, None) is None:
        return
    connection = connections[using]
    if connection.connection is not None and not connection.in_atomic_block:
        try:
            # Back to the role's and server's own defaults, not to a hard-coded 0.
            with connection.cursor() as cursor:
                cursor.execute("RESET idle_in_transaction_session_timeout; RESET lock_timeout")
        except Exception:  # the connection is gone: a new one starts with the defaults anyway
            connection.close()


@receiver(connection_created, dispatch_uid="weft_django.engine.sessions")
def _on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    limit_ms = getattr(_bound, "limits", {}).get(connection.alias)
    if limit_ms is not None and connection.vendor == "postgresql":
        _apply(connection, limit_ms)


def bounded_commit(commit: Callable[P, R], using: str, limit: timedelta) -> Callable[P, R]:
    """Wrap an atomic activity's commit step: the rest of the activity's transaction (locking the
    claim, writing the step, COMMIT) gets the engine sessions' bound, the user's code before it none."""
    limit_ms = _ms(limit)

    def commit_bounded(*args: P.args, **kwargs: P.kwargs) -> R:
        connection = connections[using]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, true), "
                    "set_config('lock_timeout', %s, true)",
                    [limit_ms, limit_ms],
                )
        return commit(*args, **kwargs)

    return commit_bounded


def allow_user_code(using: str) -> None:
    """Inside an engine transaction that runs workflow code (update handlers and queries run under the
    fence, ADR 0009): no idle limit for this transaction only, since a handler may legitimately take
    longer than the bound between two statements. A frozen engine caught inside one still holds that
    workflow's claim until it thaws or dies (the others' are unaffected)."""
    connection = connections[using]
    if connection.vendor == "postgresql" and getattr(_bound, "limits", {}).get(using) is not None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('idle_in_transaction_session_timeout', '0', true)")
