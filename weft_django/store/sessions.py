"""Server-side bounds on the engine's own sessions (lock_timeout, idle_in_transaction_session_timeout),
and their isolation level.

The policy (how long, and which threads) is the engine's (``weft_django.engine.sessions``); the
statements and the per-thread bookkeeping are here. A thread opts in with ``bind`` (its current
connection gets the settings now, every new connection of that thread gets them in
``connection_created``), and ``unbind`` restores the defaults. Where the backend has no sessions to
bound (``Backend.bounds_sessions`` false: SQLite) everything here is a no-op.

The engine's sessions run READ COMMITTED whatever the project set (``OPTIONS["isolation_level"]``, a
server or role ``default_transaction_isolation``): its fences, claims and queue admissions are written
for it (an UPDATE of a row a peer changed re-reads it; a statement sees what committed before it).
Under REPEATABLE READ or SERIALIZABLE each such row would fail its transaction with a serialization
error instead, and an admission's counts would come from a snapshot older than its lock.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from psycopg import IsolationLevel

from .backend import backend

P = ParamSpec("P")
R = TypeVar("R")

_bound = threading.local()  # .limits: {database alias: limit in ms} for the engine's threads

# -- client side (start, handles, transitions, schedules, testing) --------------------------

# The lock_timeout last set on each weft-wait connection (a kept connection serves many waits; most
# calls pass the same timeout, so the setting is sent when it changes, not per wait).
_wait_lock_bounds: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def bound_lock_wait(using: str, seconds: float) -> None:
    """On a weft-wait thread (``waits.Wait``), before a query's or update's statements: they wait
    ``seconds`` at most for a row lock (the session's ``lock_timeout``; at least 1 ms, since 0 means
    no limit), then fail with an error ``lock_wait_ended`` recognises. The thread's connection serves
    waits only, so the setting stays with it. A no-op where the backend has no sessions to bound.

    Args:
        using: the connection alias.
        seconds: the wait's timeout.
    """
    found = backend(using)
    if not found.bounds_sessions:
        return
    connection = found.connection
    connection.ensure_connection()
    limit_ms = str(max(1, int(seconds * 1000)))
    raw = connection.connection
    if _wait_lock_bounds.get(raw) == limit_ms:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, false)", [limit_ms])
    _wait_lock_bounds[raw] = limit_ms


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


# How long a statement of the engine's fenced commit waits for a row lock before it gives up: a row it
# writes (a workflow, step, signal or timer row) held by a user's open transaction must not stall the
# batch. The claim rows are skipped, never waited for (SKIP LOCKED); engine/containment.py carries the
# writes of a workflow whose row stays locked and commits the rest.
COMMIT_LOCK_WAIT_MS = 100
COMMIT_LOCK_WAIT_SQL = f"SET LOCAL lock_timeout = '{COMMIT_LOCK_WAIT_MS}ms'"
LOCK_NOT_AVAILABLE = "55P03"


def lock_wait_ended(exc: BaseException) -> bool:
    """Whether the statement failed because lock_timeout ended its wait for a row (psycopg 3 or 2).

    Args:
        exc: the DatabaseError Django raised.
    """
    cause = exc.__cause__
    return LOCK_NOT_AVAILABLE in (getattr(cause, "sqlstate", None), getattr(cause, "pgcode", None))


def write_lock_busy(exc: BaseException) -> bool:
    """Whether the statement failed because SQLite's one write lock stayed held past the busy timeout
    ("database is locked").

    Args:
        exc: the DatabaseError Django raised.
    """
    return "database is locked" in str(exc)


def write_within_lock_wait(cursor: Any, sql: str, params: Any, using: str) -> bool:
    """Run ``sql`` in a transaction of its own (a savepoint inside the caller's) whose row-lock waits
    end after COMMIT_LOCK_WAIT_MS, then put the session's lock_timeout back (inside a caller's
    transaction the bound would outlive the savepoint). PostgreSQL only (``Backend.skips_locked``).

    Args:
        cursor: a cursor of ``using``'s connection; ``sql``/``params``: one write statement.
        using: the connection alias.

    Returns:
        False when a row lock another transaction holds ended the wait (nothing written), else True.

    Raises:
        DatabaseError: any other failure of the statement.
    """
    cursor.execute("SELECT current_setting('lock_timeout')")
    (session_wait,) = cursor.fetchone()
    written = True
    try:
        with transaction.atomic(using=using):
            cursor.execute(f"{COMMIT_LOCK_WAIT_SQL};\n{sql}", params)
    except DatabaseError as exc:
        if not lock_wait_ended(exc):
            raise
        written = False
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [session_wait])
    return written


def write_unlocked(rows: Any, fields: dict[str, Any] | None, using: str) -> int:
    """Update ``rows`` with ``fields`` (None: delete them), leaving out those another transaction holds
    (a user's open transaction around ``cancel()`` or ``purge()``): locked first with SKIP LOCKED
    (``FOR UPDATE``: it conflicts with every row lock, ``FOR KEY SHARE`` included, which a DELETE waits
    for), in one transaction, so a chore on the engine's loop never waits for a row (the next pass takes
    them). The write keeps ``rows``' conditions: those on other rows (a workflow still active) may have changed
    since the lock (``continuation._move_late``: a run that ended meanwhile made its ``run_id`` NULL).
    Where the database has one writer (SQLite) its transaction holds them all. Returns the rows changed."""
    with transaction.atomic(using=using):
        if backend(using).skips_locked:
            free = list(rows.select_for_update(skip_locked=True).order_by("pk").values_list("pk", flat=True))
            rows = rows.filter(pk__in=free)
        return int(rows.update(**fields) if fields is not None else rows.delete()[0])


def bound_commit_lock_wait(using: str) -> None:
    """Inside the fenced commit's transaction, as a statement of its own (where the lock's query string
    cannot carry it): its statements wait COMMIT_LOCK_WAIT_MS at most for a row lock.

    Args:
        using: the connection alias.
    """
    with backend(using).connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{COMMIT_LOCK_WAIT_MS}ms"])


@contextmanager
def lock_wait_bounded(using: str) -> Iterator[None]:
    """A savepoint (a transaction of its own outside one) whose statements wait COMMIT_LOCK_WAIT_MS at
    most for a row lock, then fail with an error ``lock_wait_ended`` recognises (the savepoint is rolled
    back); the session's lock_timeout is put back after it either way. For an engine chore whose writes
    span several tables (a schedule's firing, a retention batch): a row a user's open transaction holds
    must not keep the engine's loop waiting for the session's lock_timeout (half the claim TTL). A plain
    savepoint where the backend has no sessions to bound (SQLite).

    Args:
        using: the connection alias.
    """
    found = backend(using)
    if not found.bounds_sessions:
        with transaction.atomic(using=using):
            yield
        return
    session_wait = None
    if found.connection.in_atomic_block:  # a caller's transaction: the SET LOCAL would outlive the savepoint
        with found.connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout')")
            (session_wait,) = cursor.fetchone()
    try:
        with transaction.atomic(using=using):
            with found.connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{COMMIT_LOCK_WAIT_MS}ms"])
            yield
    finally:
        if session_wait is not None and not found.connection.needs_rollback:
            with found.connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [session_wait])


def _ms(limit: timedelta) -> str:
    return str(int(limit.total_seconds() * 1000))


# The psycopg connections whose isolation level ``_apply`` replaced, with the level they had (Django sets
# it from OPTIONS["isolation_level"]; None: the server's default), for ``unbind``.
_isolation_before: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _apply(connection: BaseDatabaseWrapper, limit_ms: str) -> None:
    # set_config() takes parameters under client- and server-side binding alike (SET does not).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false), "
            "set_config('lock_timeout', %s, false), "
            "set_config('default_transaction_isolation', 'read committed', false)",
            [limit_ms, limit_ms],
        )
    raw = connection.connection
    if raw is not None and getattr(raw, "isolation_level", None) not in (None, IsolationLevel.READ_COMMITTED):
        _isolation_before.setdefault(raw, raw.isolation_level)
        raw.isolation_level = IsolationLevel.READ_COMMITTED  # psycopg's BEGIN names it (Django's OPTIONS)


def _limits() -> dict[str, str]:
    limits: dict[str, str] | None = getattr(_bound, "limits", None)
    if limits is None:
        limits = _bound.limits = {}
    return limits


def bind(using: str, limit: timedelta) -> None:
    """Bound this thread's sessions on ``using``, now and after every reconnect. Not when the thread is
    inside someone's transaction (an engine driven from a test's atomic block): that transaction
    belongs to its caller.

    Args:
        using: the connection alias.
        limit: the idle-in-transaction and lock-wait bound.
    """
    found = backend(using)
    connection = found.connection
    if not found.bounds_sessions or connection.in_atomic_block:
        return
    _limits()[using] = _ms(limit)
    if connection.connection is not None:
        _apply(connection, _limits()[using])


def unbind(using: str) -> None:
    """Give this thread's connection the server's defaults back (it may serve other code afterwards).

    Args:
        using: the connection alias. A connection that is gone is closed (a new one starts with the defaults).
    """
    if _limits().pop(using, None) is None:
        return
    connection = backend(using).connection
    if connection.connection is not None and not connection.in_atomic_block:
        try:
            # Back to the role's and server's own defaults, not to a hard-coded 0.
            with connection.cursor() as cursor:
                cursor.execute(
                    "RESET idle_in_transaction_session_timeout; RESET lock_timeout; RESET default_transaction_isolation"
                )
            raw = connection.connection
            if raw is not None and raw in _isolation_before:
                raw.isolation_level = _isolation_before.pop(raw)
        except Exception:  # the connection is gone: a new one starts with the defaults anyway
            connection.close()


@receiver(connection_created, dispatch_uid="weft_django.engine.sessions")
def _on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    limit_ms = getattr(_bound, "limits", {}).get(connection.alias)
    if limit_ms is not None and backend(connection.alias).bounds_sessions:
        _apply(connection, limit_ms)


def bounded_commit(commit: Callable[P, R], using: str, limit: timedelta) -> Callable[P, R]:
    """Wrap an atomic activity's commit step: the rest of the activity's transaction (locking the
    claim, writing the step, COMMIT) gets the engine sessions' bound, the user's code before it none.

    Args:
        commit: the commit step to wrap.
        using: the connection alias.
        limit: the bound, for this transaction only (``SET LOCAL``).
    """
    limit_ms = _ms(limit)

    def commit_bounded(*args: P.args, **kwargs: P.kwargs) -> R:
        found = backend(using)
        if found.bounds_sessions:
            with found.connection.cursor() as cursor:
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
    workflow's claim until it thaws or dies (the others' are unaffected).

    Args:
        using: the connection alias (a no-op unless this thread bound its sessions there).
    """
    found = backend(using)
    if found.bounds_sessions and getattr(_bound, "limits", {}).get(using) is not None:
        with found.connection.cursor() as cursor:
            cursor.execute("SELECT set_config('idle_in_transaction_session_timeout', '0', true)")


def relax_commit(using: str) -> None:
    """Inside a transaction that only carries a query answer (no workflow state): commit without
    waiting for the WAL flush where the backend has one (PostgreSQL). A crash may lose it; its caller
    then times out or asks again.

    Args:
        using: the connection alias.
    """
    found = backend(using)
    if found.bounds_sessions:
        with found.connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
