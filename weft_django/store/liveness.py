"""Whether an engine's heartbeat is evidence of life: the one rule, for every reader of ``heartbeat_at``
(the takeover statements of ``claims/holding.py``, the lapse rule of ``claims/lapse.py``, the store lease
and the live and silent engines of ``engines.py``, the queues' served count, the admin, ``weft`` and
the doctor).

An engine is live when its heartbeat is within ``within`` (the claim TTL, plus the takeover grace where
a claim is taken) of the database clock, on either side::

    now - within <= heartbeat_at <= now + within

The heartbeat is written at the raw database clock (``store/clock.db_clock``: ``clock_timestamp()``, on
SQLite the machine's clock, without the test offset of workflow time), so it is compared with that
clock. A heartbeat further ahead than the tolerance is no evidence of life: no engine writes one (a hand
edit, a damaged or copied row: PostgreSQL ``'infinity'``, a date a year ahead; on SQLite text above
every date). Read as live, it kept a dead engine alive for ever: its dormant claims (ADR 0014) never
taken over, ``--reset-ownership-mode`` refused, the doctor and the admin showed it alive. A live
engine rewrites its heartbeat on every renewal (heals a damaged row within a renew interval), and one
written just after a reader's clock reading (a few ms ahead of it) is well within the tolerance.

Where rows are compared in SQL they are compared as stored (a heartbeat Python cannot hold is still
placed: ``'infinity'`` is ahead, ``'-infinity'`` behind; on SQLite text compares as text). The column
is never wrapped in a function: the clock side carries the arithmetic.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q

from .backend import backend
from .clock import _python_now


def live(now: datetime, within: timedelta, *, field: str = "heartbeat_at") -> Q:
    """A filter of engine rows (or rows with a heartbeat ``field``) whose heartbeat is evidence of life.

    Args:
        now: the raw database clock's reading (``db_clock``).
        within: the tolerance either side of ``now`` (the claim TTL; plus a grace where a claim is taken).
        field: the heartbeat's field or lookup path.
    """
    return Q(**{f"{field}__gte": now - within, f"{field}__lte": now + within})


def silent(now: datetime, within: timedelta, *, field: str = "heartbeat_at") -> Q:
    """The complement of ``live`` (the column is NOT NULL): the heartbeat is older than ``within`` or
    further ahead than it.

    Args:
        now, within, field: as for ``live``.
    """
    return Q(**{f"{field}__lt": now - within}) | Q(**{f"{field}__gt": now + within})


def is_live(heartbeat_at: datetime | None, now: datetime, within: timedelta) -> bool:
    """The same rule for a heartbeat already read (None: no engine row, or a value Python cannot hold:
    no evidence of life).

    Args:
        heartbeat_at: the heartbeat read; ``now``, ``within``: as for ``live``.
    """
    return heartbeat_at is not None and now - within <= heartbeat_at <= now + within


def silent_sql(column: str, vendor: str) -> str:
    """SQL true when the heartbeat in ``column`` is no evidence of life. PostgreSQL compares with
    ``clock_timestamp()`` and takes the tolerance in milliseconds, twice; SQLite takes the two bounds
    (``silent_params`` gives the parameters either way).

    Args:
        column: the heartbeat column as the statement names it (``e.heartbeat_at``): an identifier.
        vendor: the connection's vendor.
    """
    if vendor == "postgresql":
        return (
            f"({column} < clock_timestamp() - %s * interval '1 millisecond' "
            f"OR {column} > clock_timestamp() + %s * interval '1 millisecond')"
        )
    return f"({column} < %s OR {column} > %s)"


def silent_params(within: timedelta, using: str, now: datetime | None = None) -> list[object]:
    """The parameters of ``silent_sql`` for connection ``using``.

    Args:
        within: the tolerance.
        using: the connection alias.
        now: SQLite only: the clock reading the bounds are taken from (None: read now). Compared as the
            ORM writes the heartbeat (naive, in the connection's time zone).
    """
    found = backend(using)
    if found.vendor == "postgresql":
        ms = round(within.total_seconds() * 1000)
        return [ms, ms]
    at = _python_now() if now is None else now
    adapt = found.connection.ops.adapt_datetimefield_value
    return [adapt(at - within), adapt(at + within)]
