"""The one clock: the database's. Claims and heartbeats use it raw; workflow time (timers, deadlines,
start_at, schedules, retention) adds a test offset kept in a one-row table, so tests can skip time
without expiring every claim. The engine's own clock is never used on PostgreSQL.

On SQLite the database is a file on this machine, so the machine's clock is the database's clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connections

from ..conf import database_alias
from ..models import ClockOffset
from . import notify
from .backend import backend

OFFSET_TABLE = "weft_django_clockoffset"
_OFFSET_SQL = f"COALESCE((SELECT offset_ms FROM {OFFSET_TABLE} WHERE id = 1), 0)"


def clock_sql(vendor: str) -> str:
    """SQL for the raw database clock (claims, renewals, heartbeats). SQLite takes a parameter."""
    return "clock_timestamp()" if vendor == "postgresql" else "%s"


def workflow_now_sql(vendor: str) -> str:
    """SQL for workflow time (clock + test offset). SQLite takes a parameter."""
    if vendor == "postgresql":
        return f"(clock_timestamp() + {_OFFSET_SQL} * interval '1 millisecond')"
    return "%s"


def _python_now() -> datetime:
    return datetime.now(UTC)


def db_clock(using: str | None = None) -> datetime:
    """The raw database clock (``clock_timestamp()``, not ``now()``: that is the transaction's start)."""
    store = backend(using or _default_alias())
    if not store.has_clock:
        return _python_now()
    with store.connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        value: datetime = cursor.fetchone()[0]
    return value


def db_now(using: str | None = None) -> datetime:
    """Workflow time: the database clock plus the test offset."""
    store = backend(using or _default_alias())
    with store.connection.cursor() as cursor:
        if store.has_clock:
            cursor.execute(f"SELECT {workflow_now_sql('postgresql')}")
            value: datetime = cursor.fetchone()[0]
            return value
        cursor.execute(f"SELECT {_OFFSET_SQL}")
        return _python_now() + timedelta(milliseconds=cursor.fetchone()[0])


def offset(using: str | None = None) -> timedelta:
    """The test offset of workflow time (zero unless a test moved it)."""
    with connections[using or _default_alias()].cursor() as cursor:
        cursor.execute(f"SELECT {_OFFSET_SQL}")
        return timedelta(milliseconds=cursor.fetchone()[0])


def set_offset(delta: timedelta, using: str | None = None) -> None:
    """Set workflow time to database time + ``delta`` (tests; every process sees it). Engines that
    reuse a recent clock reading (see ``offset_generation``) hear of it: in this process through the
    generation, elsewhere through a wake-up that makes them read the clock again."""
    global _offset_generation

    alias = using or _default_alias()
    ClockOffset.objects.using(alias).update_or_create(id=1, defaults={"offset_ms": round(delta.total_seconds() * 1000)})
    _offset_generation += 1
    notify.send("c", "*", alias)


_offset_generation = 0


def offset_generation() -> int:
    """Bumped by every ``set_offset`` in this process: a clock reading taken before is stale."""
    return _offset_generation


def advance(delta: timedelta, using: str | None = None) -> None:
    """Move workflow time forward by ``delta`` (timers and deadlines come due; claims do not expire)."""
    set_offset(offset(using) + delta, using)


def _default_alias() -> str:
    return database_alias()
