"""The database differences, as one backend class per vendor behind one interface.

``backend(using)`` returns the backend of a connection alias. Code outside ``weft_django.store``
never reads ``connection.vendor``: it asks the backend what the database can do (``listens``,
``skips_locked``, ...) or calls a store function that hides the difference. New vendor-specific
behaviour is a method here, with an implementation in each subclass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

T = TypeVar("T")

# The parameters a statement may bind. PostgreSQL: its protocol counts them in 16 bits (server-side
# binding; psycopg's client-side binding has no limit of its own). SQLite: the connection's
# SQLITE_LIMIT_VARIABLE_NUMBER (32,766 by default since SQLite 3.32.0, 250,000 in Debian's builds);
# where the driver cannot read it (no ``getlimit``), 999, the default before 3.32.0 and what Django's
# own batches assume.
POSTGRESQL_MAX_PARAMS = 65535
SQLITE_MAX_PARAMS_UNKNOWN = 999
# What a chunked statement keeps for its other parameters (statuses, an engine id, a name): a caller
# with more says how many (``Backend.chunks(reserved=)``).
RESERVED_PARAMS = 100


class Backend:
    """What every supported database offers weft, and how to say it in SQL.

    Attributes:
        vendor: Django's vendor name of the connection.
        listens: the database delivers LISTEN/NOTIFY wake-ups (else engines poll).
        skips_locked: row locks can be taken with SKIP LOCKED (else the database has one writer).
        bounds_sessions: server-side session limits (lock_timeout, idle_in_transaction...) exist.
        batches_statements: several statements can run in one round trip with one CTE statement.
        has_clock: the database has its own clock (else the machine's clock is the database's).
        concurrent_writers: two sessions can write at once (else a second writer waits for the first):
            the engine's commit runs beside its next claim (``WEFT["CLAIM_AHEAD"]``) only where they can.
    """

    vendor: ClassVar[str] = ""
    listens: ClassVar[bool] = False
    skips_locked: ClassVar[bool] = False
    bounds_sessions: ClassVar[bool] = False
    batches_statements: ClassVar[bool] = False
    has_clock: ClassVar[bool] = False
    concurrent_writers: ClassVar[bool] = False

    def __init__(self, alias: str) -> None:
        self.alias = alias

    @property
    def connection(self) -> Any:
        """The Django connection wrapper of this alias (per thread, as Django keeps them)."""
        return connections[self.alias]

    # -- engine side: claims, the fenced commit, mailbox, timers, engines, epochs, sessions ------

    @classmethod
    def next_epoch_sql(cls) -> str:
        """SQL that draws the next epoch: an inline expression where ``batches_statements``, else a
        complete statement returning one row with the new value (see ``store.epochs``)."""
        return _SQLITE_NEXT_EPOCH

    def select_next_epoch_sql(self) -> str:
        """A complete statement that draws the next epoch and returns it as its one row."""
        return _SQLITE_NEXT_EPOCH

    @property
    def joins_statements(self) -> bool:
        """Whether one execute may carry several statements, each result set read with nextset()."""
        return False

    def lock_sql(self, *, no_key: bool = False, skip_locked: bool = False) -> str:
        """The row-lock suffix of a SELECT, for SQL the store formats (a ``*_sql`` builder of constant fragments, the
        form tests/project/test_security.py's scan of raw SQL trusts): empty where there is one writer.

        Args:
            no_key: take FOR NO KEY UPDATE (does not block inserts referencing the row).
            skip_locked: skip rows another transaction holds instead of waiting.
        """
        return ""

    # -- client side: runs, schedules, clock, notify, prepared statements, testing --------------

    #: named prepared statements are used for the largest statements (see ``store/prepared.py``).
    prepares_statements: ClassVar[bool] = False
    #: a start, a signal, a claim rotation are each one statement (CTEs, RETURNING, NOTIFY inside).
    writes_in_one_statement: ClassVar[bool] = False
    #: the statements that make the current transaction (or connection) refuse writes, and undo it
    #: after (the replay check, store/replay.py).
    read_only_sql: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = ((), ())
    #: sent first in a read-only transaction weft began itself: every read of it from one snapshot.
    snapshot_sql: ClassVar[tuple[str, ...]] = ()
    # Where Django's transactions take the database's one write lock (SQLite's IMMEDIATE), the mode of
    # a read-only transaction instead (store/replay.read_only), so a long read stalls no writer.
    read_transaction_mode: ClassVar[str | None] = None

    def lock_name(self, namespace: int, name: str) -> None:
        """Inside a transaction: serialise with every other transaction that locks ``(namespace, name)``
        until this one ends (flow control's admissions). Here nothing to do: SQLite's IMMEDIATE
        transaction already holds the database's one write lock.

        Args:
            namespace: a 32-bit number for the kind of name (store/queues.py, store/limits.py).
            name: the queue's or activity's name.
        """

    def try_lock_name(self, namespace: int, name: str) -> bool:
        """Inside a transaction: take ``lock_name``'s lock if no other transaction holds it, without
        waiting; whether it was taken (False: another transaction holds it, skip this work for now).
        Here always True: SQLite's IMMEDIATE transaction already holds the database's one write lock.
        Flow control (store/queues.py, store/limits.py) uses this one: an engine stopped (SIGSTOP)
        while holding a lock must not stall the others' admissions and dispatches.

        Args:
            namespace: a 32-bit number for the kind of name; ``name``: the queue's or activity's name.
        """
        return True

    def max_params(self) -> int:
        """The most parameters one statement may bind on this database (see ``chunks``)."""
        return POSTGRESQL_MAX_PARAMS

    def chunks(self, items: Iterable[T], *, per_item: int = 1, reserved: int = RESERVED_PARAMS) -> list[list[T]]:
        """``items`` in order, cut into lists each small enough for one statement: the one rule for a
        list whose length the caller's input or the load decides (ids of a ``start_many``, a purge,
        an engine's batch), bound as ``IN (%s, ...)`` or through the ORM's ``__in`` (which Django does
        not split). SQLite refuses a statement with more parameters than its limit ("too many SQL
        variables"), so such a statement runs once per chunk, in the caller's transaction.

        Args:
            items: the values, in the order the statements should take them (sorted ids: the lock order).
            per_item: the parameters each item binds (2 for ``workflow_id IN (...) AND epoch IN (...)``).
            reserved: the statement's other parameters, at most.
        """
        values = list(items)
        size = max(1, (self.max_params() - reserved) // per_item)
        return [values[at : at + size] for at in range(0, len(values), size)]

    def binds_each(self, total: int) -> bool:
        """Whether a statement may bind its filters' ``in`` lists value by value, ``total`` values in
        all (see ``in_values``)."""
        return True

    def in_values(self, field: Any, values: list[Any], *, total: int | None = None) -> Any:
        """What ``<field>__in`` takes for ``values`` (a filter's list, one statement: no chunks): the
        list itself. SQLite: past its parameter limit, one JSON array read by ``json_each``.

        Args:
            total: the values every ``in`` list of the statement binds together (default: this
                list's): two lists each within the limit may pass it together.
        """
        return values

    @property
    def display_name(self) -> str:
        """The database's name as operators read it (Django's vendor name: postgresql, sqlite)."""
        return self.vendor

    def ping(self) -> None:
        """One round trip to the database (``SELECT 1``); the driver's error if it does not answer."""
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def relax_commit(self) -> None:
        """In the current transaction: its commit need not wait for the disk (a query request: lost
        with a crash, it is asked again). Nothing where the database cannot say so."""

    def busy_sessions(self, application_name: str) -> int:
        """How many sessions named ``application_name`` run a statement now (0 where unknown)."""
        return 0

    def write_lock_free(self, *, raise_busy: bool = False) -> bool:
        """Whether no connection holds the database's write lock now (always, where rows are locked
        one by one). ``raise_busy``: raise the database's error instead of returning False."""
        return True

    def connection_capacity(self) -> int | None:
        """How many connections the server lets clients other than superusers open, in all (None: no
        such bound, e.g. SQLite's file)."""
        return None

    # -- reading rows a hand edit may have damaged (store/moments.py) -----------------------------

    # A condition on a timestamp ``{x}`` (SQL in which ``{x}`` stands for the value, once or more): true
    # where the driver makes a Python datetime of it, false or NULL where it would raise.
    readable_moment_sql: ClassVar[str] = ""
    # The stored value ``{x}`` as text, to show what a damaged row holds.
    moment_text_sql: ClassVar[str] = "CAST({x} AS TEXT)"

    # -- histories: loading workflows to resume them ----------------------------------------------

    def datetime_reader(self) -> Callable[[Any], datetime | None]:
        """A converter (for this thread's connection) of datetime columns read by a raw statement
        into what the ORM would return: aware UTC datetimes, None for NULL."""
        raise NotImplementedError


class PostgreSQLBackend(Backend):
    vendor = "postgresql"
    listens = True
    skips_locked = True
    bounds_sessions = True
    batches_statements = True
    has_clock = True
    concurrent_writers = True

    # -- engine side: claims, the fenced commit, mailbox, timers, engines, epochs, sessions ------

    @classmethod
    def next_epoch_sql(cls) -> str:
        return f"nextval('{SEQUENCE}')"

    def select_next_epoch_sql(self) -> str:
        return f"SELECT nextval('{SEQUENCE}')"

    @property
    def joins_statements(self) -> bool:
        """Whether one execute may carry several statements, each result set read with nextset():
        psycopg 3 with client-side binding (Django's default). Not with ``OPTIONS["server_side_binding"]``
        (one statement per prepared query), not psycopg2."""
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        return is_psycopg3 and not self.connection.settings_dict.get("OPTIONS", {}).get("server_side_binding")

    def lock_sql(self, *, no_key: bool = False, skip_locked: bool = False) -> str:
        clause = " FOR NO KEY UPDATE" if no_key else " FOR UPDATE"
        return clause + (" SKIP LOCKED" if skip_locked else "")

    def lock_name(self, namespace: int, name: str) -> None:
        # A transaction-scoped advisory lock: released at COMMIT or ROLLBACK (also when the server ends a
        # frozen engine's idle transaction), never left behind. Two names with one hash serialise
        # together, which is harmless.
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [namespace, name])

    def try_lock_name(self, namespace: int, name: str) -> bool:
        # The same lock, never waited for: a miss means another transaction (maybe of a stopped engine)
        # holds it; the caller skips this queue or activity until its next pass.
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))", [namespace, name])
            return bool(cursor.fetchone()[0])

    # -- client side: runs, schedules, clock, notify, prepared statements, testing --------------

    prepares_statements = True
    writes_in_one_statement = True
    read_only_sql = (("SET TRANSACTION READ ONLY",), ())
    snapshot_sql = ("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",)

    def relax_commit(self) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")

    def busy_sessions(self, application_name: str) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'active'",
                [application_name],
            )
            return int(cursor.fetchone()[0])

    def connection_capacity(self) -> int | None:
        # max_connections less the slots kept for superusers (and, from PostgreSQL 16, for roles with
        # pg_use_reserved_connections): what is left for everybody else, the engines included.
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"
                " - COALESCE(current_setting('reserved_connections', true)::int, 0)"
            )
            return int(cursor.fetchone()[0])

    # psycopg reads a timestamptz as its text in the session's time zone (UTC under Django): past year
    # 9999, before year 1 or +-infinity it raises DataError. EXTRACT reads the year in that zone too
    # (1 BC is -1, infinity Infinity).
    readable_moment_sql = "EXTRACT(YEAR FROM {x}) BETWEEN 1 AND 9999"
    moment_text_sql = "({x})::text"

    # -- histories: loading workflows to resume them ----------------------------------------------

    def datetime_reader(self) -> Callable[[Any], datetime | None]:
        return _unchanged  # psycopg returns aware datetimes for timestamptz


class SQLiteBackend(Backend):
    vendor = "sqlite"
    read_only_sql = (("PRAGMA query_only = ON",), ("PRAGMA query_only = OFF",))
    read_transaction_mode = "DEFERRED"  # takes no write lock: engines go on committing (WAL) meanwhile

    def max_params(self) -> int:
        # Read from the connection each time (one C call): a build or a ``setlimit`` may lower it.
        import sqlite3

        connection = self.connection
        connection.ensure_connection()
        getlimit = getattr(connection.connection, "getlimit", None)  # Python 3.11+
        return int(getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)) if getlimit else SQLITE_MAX_PARAMS_UNKNOWN

    def binds_each(self, total: int) -> bool:
        return total <= self.max_params() - RESERVED_PARAMS

    def in_values(self, field: Any, values: list[Any], *, total: int | None = None) -> Any:
        if self.binds_each(len(values) if total is None else total):
            return values
        import json

        from django.db.models.expressions import RawSQL

        # Each value as the column stores it (a datetime: its UTC text), compared with the column as is.
        stored = [field.get_db_prep_value(value, self.connection) for value in values]
        return RawSQL("SELECT value FROM json_each(%s)", [json.dumps(stored)])

    # -- engine side: claims, the fenced commit, mailbox, timers, engines, epochs, sessions ------

    # -- client side: runs, schedules, clock, notify, prepared statements, testing --------------

    def write_lock_free(self, *, raise_busy: bool = False) -> bool:
        # SQLite has one write lock for the whole file: try to take it, on a connection of our own.
        import sqlite3

        probe = sqlite3.connect(str(self.connection.settings_dict["NAME"]), timeout=0.2, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            if raise_busy:
                raise
            return False
        finally:
            probe.close()

    # SQLite keeps whatever text was written; Django parses it (a date-and-time shape with a year 0,
    # a month 13, a February 30 or an hour 25 raises ValueError; another shape, or a number, reads as
    # None or raises TypeError). Readable: text whose date is a real one (SQLite's date() of its first
    # ten characters, normalised by a modifier, gives them back unchanged: 2024-02-30 becomes
    # 2024-03-01) and whose instant, in UTC, is within years 1-9999.
    readable_moment_sql = (
        "typeof({x}) = 'text' AND date(substr({x}, 1, 10), '+0 days') = substr({x}, 1, 10) "
        "AND datetime({x}) BETWEEN '0001-01-01 00:00:00' AND '9999-12-31 23:59:59'"
    )

    # -- histories: loading workflows to resume them ----------------------------------------------
    def datetime_reader(self) -> Callable[[Any], datetime | None]:
        """SQLite gives naive UTC datetimes (or text): converted as the ORM converts them."""
        connection = self.connection
        convert = connection.ops.convert_datetimefield_value

        def read(value: Any) -> datetime | None:
            return None if value is None else convert(value, None, connection)

        return read


def _unchanged(value: Any) -> Any:
    return value


# The epoch sequence (migration 0002) and SQLite's one-row counter standing in for it.
SEQUENCE = "weft_django_epoch_seq"
COUNTER_TABLE = "weft_django_epochcounter"
# One statement, race-free: creates the counter row on first use, else increments it.
_SQLITE_NEXT_EPOCH = (
    f"INSERT INTO {COUNTER_TABLE} (id, value) VALUES (1, 1) "
    f"ON CONFLICT (id) DO UPDATE SET value = {COUNTER_TABLE}.value + 1 RETURNING value"
)

_BACKENDS: dict[str, type[Backend]] = {"postgresql": PostgreSQLBackend, "sqlite": SQLiteBackend}
_cache: dict[str, Backend] = {}


def backend(using: str | None = None) -> Backend:
    """The backend of connection alias ``using`` (default: the default alias).

    Raises:
        ImproperlyConfigured: the alias's database is neither PostgreSQL nor SQLite.
    """
    alias = using or DEFAULT_DB_ALIAS
    found = _cache.get(alias)
    if found is None:
        vendor = connections[alias].vendor
        cls = _BACKENDS.get(vendor)
        if cls is None:
            raise ImproperlyConfigured(
                f"weft_django supports PostgreSQL and SQLite; database {alias!r} is {vendor}. "
                "Point WEFT['DATABASE'] at a PostgreSQL or SQLite alias."
            )
        found = _cache[alias] = cls(alias)
    return found
