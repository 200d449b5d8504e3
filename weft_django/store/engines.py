"""Engine rows: register, heartbeat, the store-wide lease, stop; the ownership-mode marker."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, OperationalError, transaction
from django.db.models import Q
from django.utils.dateparse import parse_datetime

from ..models import Engine, OwnershipMarker, StoreLease
from .backend import backend
from .clock import _python_now, db_clock
from .epochs import next_epoch, next_epoch_sql
from .liveness import live, silent, silent_params, silent_sql
from .sessions import lock_wait_bounded, lock_wait_ended, write_within_lock_wait

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------

LEASE_TABLE = StoreLease._meta.db_table


def _ms(delta: timedelta) -> int:
    return round(delta.total_seconds() * 1000)


def register_engine(engine_id: str, mode: str, using: str, *, queues: list[str] | None = None) -> None:
    """Insert or refresh this engine's row (host, pid, mode, the queues it serves; started and heartbeat
    now, not stopped).

    Args:
        engine_id: the engine; ``mode``: its BACKGROUND_TASKS mode; ``using``: the connection alias.
        queues: the queues it admits from (None: every queue of WEFT["QUEUES"]).
    """
    now = db_clock(using)
    values = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "mode": mode,
        "started_at": now,
        "heartbeat_at": now,
        "stopped_at": None,
        "queues": queues,
    }
    # written over, never read first: an earlier row of this id may hold a value the driver cannot
    # convert (a timestamp past year 9999 on PostgreSQL), which must not keep this engine from starting
    row = Engine.objects.using(using).filter(id=engine_id)
    try:
        with lock_wait_bounded(using):
            if row.update(**values):
                return
        try:
            with transaction.atomic(using=using):
                Engine.objects.using(using).create(id=engine_id, **values)
        except IntegrityError:  # registered meanwhile under this id
            with lock_wait_bounded(using):
                row.update(**values)
    except DatabaseError as exc:
        if not lock_wait_ended(exc):
            raise
        raise RowHeld(Engine._meta.db_table, engine_id) from exc


class RowHeld(OperationalError):
    """A start-up statement found its row locked by another transaction (a user's open transaction, e.g.
    ``SELECT ... FOR UPDATE`` left open in psql), past its lock wait: the engine's own row
    (``register_engine``, COMMIT_LOCK_WAIT_MS: waiting out the session's lock_timeout, 15 s, kept the
    start-up's transaction, and the ownership mode marker it had locked, open, so every other engine's
    start-up waited for the marker) or the marker (``mode_marker``, the session's lock_timeout). An
    OperationalError naming the row: start-up tries again after its back-off and logs it
    (``engine.ownership.retried_at_start_up``), where the driver's message named none."""

    def __init__(self, table: str, key: object, then: str = "the engine starts once it ends") -> None:
        self.table, self.key = table, key
        super().__init__(
            f"row id={key!r} of {table} is locked by another transaction (a user's open transaction?); {then}"
        )


def heartbeat_engine(engine_id: str, using: str) -> bool:
    """Record a heartbeat of ``engine_id`` at the database clock, unless another transaction holds its
    row (a user's open transaction): then this one is skipped, never waited for (the renewal thread
    writes it after every pass, and waiting stalled the renewal of every claim). Returns whether written.

    Args:
        engine_id: the engine; ``using``: the connection alias.
    """
    found = backend(using)
    lock = found.lock_sql(no_key=True, skip_locked=True)
    table, now = Engine._meta.db_table, db_clock(using)
    with found.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET heartbeat_at = %s WHERE id = (SELECT id FROM {table} WHERE id = %s{lock})",
            [found.connection.ops.adapt_datetimefield_value(now), engine_id],
        )
        return bool(cursor.rowcount)


def stop_engine(engine_id: str, using: str) -> bool:
    """Record that ``engine_id`` stopped, at the database clock: only while the row is still this
    process's registration. A successor that registered the id again while this one drained (a
    supervisor started again, a restart that did not wait) is alive and must not be shown stopped.
    A row another transaction holds (a user's open transaction) is waited for COMMIT_LOCK_WAIT_MS at
    most, then left unmarked (its heartbeat stops: it reads as silent after the TTL): waiting out the
    session's lock_timeout, twice (the shutdown tries a failed step again), kept a stopping engine for
    a whole claim TTL past its drain.

    Returns:
        False when the row was left unmarked (locked elsewhere), else True.
    """
    found = backend(using)
    table, now = Engine._meta.db_table, found.connection.ops.adapt_datetimefield_value(db_clock(using))
    sql = f"UPDATE {table} SET stopped_at = %s WHERE id = %s AND host = %s AND pid = %s"
    params = [now, engine_id, socket.gethostname(), os.getpid()]
    with found.connection.cursor() as cursor:
        if not found.skips_locked:  # one writer: nothing to wait for
            cursor.execute(sql, params)
            return True
        return write_within_lock_wait(cursor, sql, params, using)


def other_live_engines(engine_id: str, *, within: timedelta, using: str) -> list[str]:
    """Engines other than this one with a heartbeat within ``within`` of the database clock, either side
    (``store/liveness.py``: one further ahead is no evidence of life), and no stop recorded."""
    return list(
        Engine.objects.using(using)
        .filter(live(db_clock(using), within), stopped_at__isnull=True)
        .exclude(id=engine_id)
        .values_list("id", flat=True)
    )


def silent_engines(*, within: timedelta, using: str) -> list[str]:
    """Engines whose heartbeat is no evidence of life (older than ``within``, or further ahead than it:
    ``store/liveness.py``) or that recorded a stop: the only holders whose claims the frequent takeover
    scan looks at (engine/claimer.py). A few rows: one per engine id ever registered."""
    return list(
        Engine.objects.using(using)
        .filter(Q(stopped_at__isnull=False) | silent(db_clock(using), within))
        .values_list("id", flat=True)
    )


def mode_marker(engine_id: str, mode: str, using: str) -> tuple[str, str, bool]:
    """The one-row ownership-mode marker, created with ``mode`` (set by ``engine_id``) if missing.
    Its ``set_at`` is not read (``mode_set_at``): a hand-edited one the driver cannot convert (past
    year 9999) must not keep every engine from starting.

    Returns:
        (its mode, the engine that set it, whether this call created it).
    """
    markers = OwnershipMarker.objects.using(using)
    with transaction.atomic(using=using):
        try:
            found = markers.select_for_update().filter(id=1).values_list("mode", "set_by").first()
        except DatabaseError as exc:
            if not lock_wait_ended(exc):
                raise
            raise RowHeld(OwnershipMarker._meta.db_table, 1) from exc
        if found is not None:
            return found[0], found[1], False
        marker, created = markers.get_or_create(
            id=1, defaults={"mode": mode, "set_by": engine_id, "set_at": db_clock(using)}
        )
    return marker.mode, marker.set_by, created


def mode_set_at(using: str) -> datetime | None:
    """When the ownership-mode marker was set; None when there is none or the driver cannot convert it."""
    try:
        found: datetime | None = OwnershipMarker.objects.using(using).values_list("set_at", flat=True).first()
    except (DataError, ValueError, TypeError):  # a value Python cannot represent (a hand edit)
        return None
    return found


def reset_mode_marker(using: str) -> None:
    """Delete the ownership-mode marker (after every engine stopped: a deliberate change of mode).

    Raises:
        RowHeld: another transaction holds the marker's row past COMMIT_LOCK_WAIT_MS (nothing deleted).
    """
    with _marker_lock_wait(using):
        OwnershipMarker.objects.using(using).filter(id=1).delete()


def reset_mode_marker_unless_alive(*, within: timedelta, using: str) -> list[str]:
    """Delete the ownership-mode marker unless some engine heartbeats within ``within``: then return
    those engines (nothing deleted), else []. The marker's row is locked before the look, and an
    engine checks its mode and registers its row under that lock, in one transaction
    (``engine.ownership.start_up``): no engine can start between the look and the delete and run on
    without its mode recorded (the next engine then recorded any mode it had).

    Raises:
        RowHeld: another transaction holds the marker's row past COMMIT_LOCK_WAIT_MS (nothing deleted;
            the caller may try again). The lock used to be waited for without bound (the command's
            session has no lock_timeout), so a user's open transaction on it hung the command.
    """
    with transaction.atomic(using=using):
        with _marker_lock_wait(using):
            list(OwnershipMarker.objects.using(using).select_for_update().filter(id=1).values_list("id", flat=True))
        alive = other_live_engines("", within=within, using=using)
        if not alive:
            OwnershipMarker.objects.using(using).filter(id=1).delete()
        return alive


@contextmanager
def _marker_lock_wait(using: str) -> Iterator[None]:
    """Statements on the ownership-mode marker's row that wait COMMIT_LOCK_WAIT_MS at most for a lock
    another transaction holds (``lock_wait_bounded``), then raise ``RowHeld`` naming the row."""
    try:
        with lock_wait_bounded(using):
            yield
    except DatabaseError as exc:
        if not lock_wait_ended(exc):
            raise
        raise RowHeld(OwnershipMarker._meta.db_table, 1, "nothing was changed") from exc


def acquire_store_lease(engine_id: str, *, ttl: timedelta, grace: timedelta, using: str) -> int | None:
    """Take the store-wide lease if nobody holds it, we do, or its holder's lease expired more than
    ``grace`` ago (the same rule as a workflow claim, store/claims/lapse.py): or its expiry is further
    ahead than a renewal ever sets it (more than ``ttl``: a hand edit, ``'infinity'``) and its holder's
    heartbeat is no evidence of life (more than ``ttl`` + ``grace`` old, or as far ahead:
    ``store/liveness.py``), or its holder has no engine row. Such a row held by a dead engine kept every
    engine from starting, for ever.

    A lease row another transaction holds (a user's open transaction) is waited for COMMIT_LOCK_WAIT_MS
    at most, then not taken this time: the wait for the session's lock_timeout, on every attempt, kept
    a standby's heartbeat (written between attempts) and its SIGTERM waiting as long.

    Returns:
        The new lease epoch, or None (another engine holds it, or its row is held elsewhere).
    """
    found = backend(using)
    engines = Engine._meta.db_table
    with transaction.atomic(using=using), found.connection.cursor() as cursor:
        if found.has_clock:
            cursor.execute(f"INSERT INTO {LEASE_TABLE} (id, epoch) VALUES (1, 0) ON CONFLICT (id) DO NOTHING")
            try:
                with lock_wait_bounded(using):
                    return _take_lease(cursor, engine_id, ttl, grace, using)
            except DatabaseError as exc:
                if not lock_wait_ended(exc):
                    raise
                return None  # its row held elsewhere (a user's open transaction): tried again later
        now = _python_now()
        cursor.execute(f"INSERT OR IGNORE INTO {LEASE_TABLE} (id, epoch) VALUES (1, 0)")
        # as stored text (SQLiteBackend.moment_text_sql), parsed by ``_moment``: the driver's own conversion
        # of the declared datetime column raised ValueError for text that is no date (a hand edit), and no
        # engine could take the lease
        cursor.execute(f"SELECT engine_id, CAST(expires_at AS TEXT) FROM {LEASE_TABLE} WHERE id = 1")
        holder, expires_at = cursor.fetchone()
        # the holder's heartbeat compared in SQL, as stored (store/liveness.py): text that is no date
        # compares as text, as in the takeover of claims
        cursor.execute(
            f"SELECT {silent_sql('heartbeat_at', found.vendor)} FROM {engines} WHERE id = %s",
            [*silent_params(ttl + grace, using, now), holder],
        )
        registered = cursor.fetchone()
        expires = _moment(expires_at)
        gone = registered is None or bool(registered[0])
        dormant = expires is not None and expires > now + ttl and gone
        if holder not in (None, engine_id) and expires is not None and expires + grace >= now and not dormant:
            return None
        epoch = next_epoch(using)
        cursor.execute(
            f"UPDATE {LEASE_TABLE} SET epoch = %s, engine_id = %s, claimed_at = %s, expires_at = %s WHERE id = 1",
            [epoch, engine_id, now, now + ttl],
        )
        return epoch


def _take_lease(cursor: Any, engine_id: str, ttl: timedelta, grace: timedelta, using: str) -> int | None:
    """``acquire_store_lease``'s UPDATE on PostgreSQL (the database clock). Returns the new epoch or None."""
    engines = Engine._meta.db_table
    cursor.execute(
        f"""UPDATE {LEASE_TABLE} SET epoch = {next_epoch_sql("postgresql")}, engine_id = %s,
                claimed_at = clock_timestamp(), expires_at = clock_timestamp() + %s * interval '1 millisecond'
            WHERE id = 1 AND (engine_id IS NULL OR engine_id = %s
                OR expires_at + %s * interval '1 millisecond' < clock_timestamp()
                OR (expires_at > clock_timestamp() + %s * interval '1 millisecond' AND (EXISTS (
                    SELECT 1 FROM {engines} e WHERE e.id = {LEASE_TABLE}.engine_id
                    AND {silent_sql("e.heartbeat_at", "postgresql")})
                    OR NOT EXISTS (SELECT 1 FROM {engines} e WHERE e.id = {LEASE_TABLE}.engine_id))))
            RETURNING epoch""",
        [engine_id, _ms(ttl), engine_id, _ms(grace), _ms(ttl), *silent_params(ttl + grace, using)],
    )
    row = cursor.fetchone()
    return int(row[0]) if row else None


def _moment(value: object) -> datetime | None:
    """A timestamp SQLite returned (text, or a datetime; naive is UTC); None for text that is no date
    (a hand edit)."""
    try:
        moment = parse_datetime(value) if isinstance(value, str) else value
    except ValueError:
        return None
    if not isinstance(moment, datetime):
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def renew_store_lease(engine_id: str, epoch: int, *, ttl: timedelta, using: str) -> bool:
    """Extend the lease at our epoch. False means another engine took it: we are deposed engine-wide.

    A lease row another transaction holds (a user's open transaction) is skipped, never waited for, and
    is no loss while a plain read still shows it ours at ``epoch`` (renewed next time): the wait (the
    session's lock_timeout) failed the renewal pass, so the engine's claims went unrenewed and its
    heartbeat unwritten for as long as the row was held."""
    found = backend(using)
    lock = found.lock_sql(no_key=True, skip_locked=True)
    held = f"id = (SELECT id FROM {LEASE_TABLE} WHERE id = 1{lock}) AND engine_id = %s AND epoch = %s"
    with found.connection.cursor() as cursor:
        if found.has_clock:
            cursor.execute(
                f"UPDATE {LEASE_TABLE} SET expires_at = clock_timestamp() + %s * interval '1 millisecond' WHERE {held}",
                [_ms(ttl), engine_id, epoch],
            )
        else:
            cursor.execute(
                f"UPDATE {LEASE_TABLE} SET expires_at = %s WHERE {held}", [_python_now() + ttl, engine_id, epoch]
            )
        if cursor.rowcount == 1:
            return True
        cursor.execute(f"SELECT engine_id, epoch FROM {LEASE_TABLE} WHERE id = 1")
        return cursor.fetchone() == (engine_id, epoch)


def release_store_lease(engine_id: str, epoch: int, using: str) -> bool:
    """Give the lease up if we still hold it at ``epoch``. A lease row another transaction holds (a
    user's open transaction) is waited for COMMIT_LOCK_WAIT_MS at most, then left held, to expire:
    waiting out the session's lock_timeout (half the TTL) kept a stopping engine past its drain, and
    the failure skipped the rest of its shutdown (its engine row was not marked stopped).

    Returns:
        False when the row was left held (locked elsewhere), else True.
    """
    found = backend(using)
    sql = f"UPDATE {LEASE_TABLE} SET engine_id = NULL, expires_at = NULL WHERE id = 1 AND engine_id = %s AND epoch = %s"
    with found.connection.cursor() as cursor:
        if not found.skips_locked:  # one writer: nothing to wait for
            cursor.execute(sql, [engine_id, epoch])
            return True
        return write_within_lock_wait(cursor, sql, [engine_id, epoch], using)
