"""Named prepared statements for weft's hottest PostgreSQL statements, safe behind connection poolers.

The one-statement fenced commit and the one-statement start are large CTE statements: PostgreSQL
spends longer planning them (1.5-5 ms on a small VM) than running them. Prepared once per connection,
each later execution skips the planning.

Django's psycopg backend leaves psycopg's automatic preparation off because of poolers: psycopg names
its statements by a per-connection counter ("_pg3_0", "_pg3_1", ...), and behind PgBouncer in
transaction mode (before 1.21) a name prepared on one server connection can reach another where the
same name holds a different statement. Here the name is a digest of the statement's text, so any
server connection that knows the name holds exactly this statement: the worst a pooler can do is
send the EXECUTE where the name is unknown, which fails (SQLSTATE 26000) without doing anything, and
the statement then runs unprepared. A connection that keeps missing stops preparing.

Used only in autocommit (outside ``atomic()``): a failed EXECUTE inside a transaction would abort it.
Only with client-side binding (Django's default; ``OPTIONS["server_side_binding"]`` off), where the
parameters travel as literals in ``EXECUTE name(...)``. ``WEFT["PREPARED_STATEMENTS"] = False`` turns
it off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DatabaseError

from ..conf import prepared_statements
from .backend import backend

UNKNOWN_STATEMENT = "26000"  # invalid_sql_statement_name: EXECUTE of a name this server connection lacks
ALREADY_PREPARED = "42P05"  # duplicate_prepared_statement: PREPARE of a name it already has
# feature_not_supported, "cached plan must not change result type": a migration changed a column the
# statement returns while the connection lived. The statement is dropped and prepared again.
STALE_PLAN = "0A000"
MAX_MISSES = 3  # EXECUTEs of a name the server connection lacked: then it is behind a pooler, stop

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")

# Plans for statements that touch a few rows by key (a batch's ids). A prepared statement is planned with
# the statistics of the moment it is planned: PostgreSQL settles on a generic plan at its sixth run and
# keeps it until the next ANALYZE, so a plan made while the tables were small (an engine's first passes
# on a new database) kept sequential scans and hash joins once they had grown (the acquire's reads: 90 ms
# each at 10,000 runs; the fenced commit: 1.5 -> 9.5 ms after 20,000 runs; docs/benchmarks.md, "The plan
# trap"). Planned without sequential scans, hash or merge joins, such a statement is index lookups in a
# nested loop whatever the statistics. Sent as ``SET LOCAL`` in the statement's own query string (one
# transaction): the settings end with it.
KEYED_PLAN = (
    "SET LOCAL enable_seqscan = off",
    "SET LOCAL enable_hashjoin = off",
    "SET LOCAL enable_mergejoin = off",
)


class _ConnectionState:
    __slots__ = ("disabled", "misses", "names", "unpreparable")

    def __init__(self) -> None:
        self.names: set[str] = set()  # prepared on this connection (as far as we know)
        self.unpreparable: set[str] = set()  # PREPARE failed (e.g. a parameter type it cannot infer)
        self.misses = 0
        self.disabled = False


_states: weakref.WeakKeyDictionary[Any, _ConnectionState] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child starts with no lock held (another thread may have held it at the fork)."""
    global _states, _states_lock
    _states, _states_lock = weakref.WeakKeyDictionary(), threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def statement_name(sql: str) -> str:
    """The statement's name: a digest of its text (same name, same statement, on any connection)."""
    return "weft_" + hashlib.sha256(sql.encode()).hexdigest()[:24]


class _Shape:
    """What a statement's text alone decides, worked out once per text (``_shape``): its name, its
    text for PREPARE (Django's ``%s`` / ``%(name)s`` placeholders as ``$1, $2, ...``, ``%%`` as
    ``%``), and where each ``$n`` takes its value from: the n-th positional value, or ``keys[n - 1]``
    of a mapping (``%(name)s`` placeholders)."""

    __slots__ = ("count", "keys", "name", "text")

    def __init__(self, sql: str) -> None:
        keys: list[str] = []
        count = 0

        def replace(match: re.Match[str]) -> str:
            nonlocal count
            if match.group(0) == "%%":
                return "%"
            key = match.group(1)
            if key is None:
                count += 1
                return f"${count}"
            if key not in keys:
                keys.append(key)
            return f"${keys.index(key) + 1}"

        self.text = _PLACEHOLDER.sub(replace, sql)
        self.name = statement_name(sql)
        self.keys = tuple(keys) if keys else None
        self.count = len(keys) if keys else count

    def ordered(self, params: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        """``params`` in ``$n`` order.

        Raises:
            KeyError: a name missing from the mapping.
            IndexError: fewer positional values than placeholders.
            TypeError: a mapping for ``%s`` placeholders or a sequence for ``%(name)s`` ones.
        """
        if self.keys is not None:
            if not isinstance(params, Mapping):
                raise TypeError("a statement with %(name)s placeholders takes its parameters as a mapping")
            return [params[key] for key in self.keys]
        if isinstance(params, Mapping):
            if self.count:
                raise TypeError("a statement with %s placeholders takes its parameters as a sequence")
            return []
        if len(params) < self.count:
            raise IndexError(f"{self.count} placeholders, {len(params)} parameters")
        return list(params[: self.count])


# The engine's statements are a few dozen texts sent thousands of times: hashing and scanning each one on
# every execution cost about 0.1 ms of engine Python per workflow (py-spy, docs/benchmarks.md session 11).
# Texts that vary with a batch's size (IN lists) are more, hence a bound.
@functools.lru_cache(maxsize=1024)
def _shape(sql: str) -> _Shape:
    return _Shape(sql)


def _usable(cursor: Any, connection: Any) -> bool:
    if not backend(connection.alias).prepares_statements:
        return False
    if connection.in_atomic_block or not connection.get_autocommit():
        return False
    try:
        import psycopg
    except ImportError:  # pragma: no cover - Django on psycopg2
        return False
    return isinstance(getattr(cursor, "cursor", None), psycopg.ClientCursor) and prepared_statements()


def _state(raw: Any) -> _ConnectionState:
    with _states_lock:
        state = _states.get(raw)
        if state is None:
            state = _states[raw] = _ConnectionState()
        return state


def _sqlstate(error: BaseException) -> str | None:
    return getattr(error.__cause__, "sqlstate", None)


def execute(cursor: Any, connection: Any, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> None:
    """``cursor.execute(sql, params)``, as a named prepared statement where that is safe (see above).

    ``cursor`` is a Django cursor of ``connection`` (its wrapper). The results are read from
    ``cursor`` as after a plain execute."""
    found = _prepare(cursor, connection, sql, params)
    if found is None:
        cursor.execute(sql, params)
        return
    state, name, ordered = found
    try:
        cursor.execute(_call(name, ordered), ordered)
    except DatabaseError as error:
        if not _forget_if_missing(cursor, state, [name], error):
            raise
        cursor.execute(sql, params)


def _call(name: str, ordered: list[Any]) -> str:
    return f"EXECUTE {name}({', '.join(['%s'] * len(ordered))})" if ordered else f"EXECUTE {name}"


def _prepare(
    cursor: Any, connection: Any, sql: str, params: Sequence[Any] | Mapping[str, Any]
) -> tuple[_ConnectionState, str, list[Any]] | None:
    """(connection state, name, parameters in order) with the statement prepared on this connection,
    or None where it is not used here (see ``_usable``) or could not be prepared."""
    if not _usable(cursor, connection):
        return None
    return _prepare_on(cursor, _state(connection.connection), sql, params)


def _prepare_on(
    cursor: Any, state: _ConnectionState, sql: str, params: Sequence[Any] | Mapping[str, Any]
) -> tuple[_ConnectionState, str, list[Any]] | None:
    """As ``_prepare``, on a connection already found usable (its ``state``)."""
    shape = _shape(sql)
    name = shape.name
    if state.disabled or name in state.unpreparable:
        return None
    ordered = shape.ordered(params)
    if name not in state.names:
        try:
            cursor.execute(f"PREPARE {name} AS {shape.text}")
        except DatabaseError as error:
            if _sqlstate(error) != ALREADY_PREPARED:
                state.unpreparable.add(name)
                return None
        state.names.add(name)
    return state, name, ordered


def _forget_if_missing(cursor: Any, state: _ConnectionState, names: list[str], error: DatabaseError) -> bool:
    """After a failed EXECUTE of one of ``names``: whether it failed because the server connection
    lacks the statement or holds a stale plan of it (nothing ran). Then they are forgotten, to be
    prepared again, and a stale one is deallocated."""
    code = _sqlstate(error)
    if code not in (STALE_PLAN, UNKNOWN_STATEMENT):
        return False
    state.names.difference_update(names)
    if code == UNKNOWN_STATEMENT:
        # Not on this server connection (a pooler moved us, or DISCARD ALL ran): run it plainly.
        state.misses += 1
        state.disabled = state.misses >= MAX_MISSES
        return True
    for name in names:  # which one's plan went stale is not said: each is prepared afresh
        with contextlib.suppress(DatabaseError):  # not there (autocommit: nothing else is affected)
            cursor.execute(f"DEALLOCATE {name}")
    return True


def execute_committed_then(
    cursor: Any,
    connection: Any,
    sql: str,
    params: Sequence[Any] | Mapping[str, Any],
    then_sql: str,
    then_params: Sequence[Any],
) -> list[tuple[Any, ...]] | None:
    """Run ``sql`` (prepared) as a transaction of its own and, once it has committed, ``then_sql``
    (positional ``%s`` placeholders) as another, in ONE round trip: ``BEGIN; EXECUTE ...; COMMIT;
    then_sql`` in one simple-protocol query string, where the server commits (and flushes) the first
    before it runs the second. ``then_sql`` is meant for what must follow a durable commit without
    holding anything during its flush (a NOTIFY: ``store.runs.NOTIFY_PIPELINED``).

    Args:
        cursor: a Django cursor of ``connection``.
        connection: the Django connection (in autocommit, outside ``atomic()``, else None is returned).
        sql: the statement, Django placeholders (``%s`` or ``%(name)s``), returning rows.
        params: its parameters.
        then_sql, then_params: the statement run after the commit, and its parameters.

    Returns:
        ``sql``'s rows, or None where this form is not used (not in autocommit, prepared statements
        off or behind a pooler, a statement the server would not prepare or no longer had): nothing
        was written then, and the caller runs the two statements itself.

    Raises:
        django.db.DatabaseError: a statement failed. The session is left outside any transaction
            (also after an interrupt). Whether ``sql`` committed is not known (it did if ``then_sql``
            failed): the caller finds out. With ``synchronous_commit`` on, ``then_sql`` runs only
            after the commit's WAL flush (and its standby's, where one is configured).
    """
    found = _prepare(cursor, connection, sql, params)
    if found is None:
        return None
    state, name, ordered = found
    try:
        cursor.execute(f"BEGIN; {_call(name, ordered)}; COMMIT; {then_sql}", [*ordered, *then_params])
    except DatabaseError as error:
        # Only a failure inside the BEGIN (the session left in a failed block) means nothing ran: the
        # same codes from the statement after the COMMIT must not re-run a start that committed.
        if _end_failed_block(cursor, connection) and _forget_if_missing(cursor, state, [name], error):
            return None
        raise
    except BaseException:  # KeyboardInterrupt: psycopg cancels the EXECUTE, leaving the failed block
        with contextlib.suppress(Exception):
            _end_failed_block(cursor, connection)
        raise
    if not cursor.nextset():  # past the BEGIN: the statement's rows
        raise DatabaseError("the pipelined statement returned no result")
    rows: list[tuple[Any, ...]] = cursor.fetchall()
    while cursor.nextset():  # the COMMIT and the statement after it
        pass
    return rows


def execute_statements(cursor: Any, connection: Any, statements: Sequence[tuple[str, Sequence[Any] | None]]) -> None:
    """Run ``statements`` as ONE query string (one round trip; in autocommit, one transaction), each
    one with parameters as a named prepared statement where ``execute`` would prepare it. The result
    sets are read from ``cursor`` (``nextset()``) as after a plain execute of the joined text.

    Args:
        cursor: a Django cursor of ``connection``.
        connection: the Django connection.
        statements: (sql with ``%s`` placeholders, its parameters) in order; parameters None: sent as
            it is, never prepared (``SET LOCAL ...``: PREPARE takes only queries and DML).

    Raises:
        django.db.DatabaseError: a statement failed (in autocommit nothing of the batch was kept).
    """
    state = _state(connection.connection) if _usable(cursor, connection) else None  # checked once per batch
    texts: list[str] = []
    values: list[Any] = []
    names: list[str] = []
    for sql, params in statements:
        found = _prepare_on(cursor, state, sql, params) if state is not None and params is not None else None
        if found is None:
            texts.append(sql)
            values.extend(params or ())
        else:
            _, name, ordered = found
            texts.append(_call(name, ordered))
            values.extend(ordered)
            names.append(name)
    try:
        cursor.execute(";\n".join(texts), values)
    except DatabaseError as error:
        # In autocommit the batch's implicit transaction is rolled back: nothing ran, run it plainly.
        if state is None or not names or not _forget_if_missing(cursor, state, names, error):
            raise
        cursor.execute(";\n".join(sql for sql, _ in statements), [v for _, params in statements for v in params or ()])


def _end_failed_block(cursor: Any, connection: Any) -> bool:
    """After a failure in ``execute_committed_then``: whether it was inside the BEGIN, where the
    server session waits in a failed transaction block for a ROLLBACK (an autocommit connection would
    fail every later statement), which is then sent. A failure after the COMMIT leaves nothing open."""
    import psycopg

    raw = connection.connection
    if raw is not None and raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        cursor.execute("ROLLBACK")
        return True
    return False
