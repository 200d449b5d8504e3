"""Fencing epochs: one global, strictly increasing series shared by every workflow id.

Drawing every epoch from one series means an id's epoch never repeats or goes down, across release,
``start_new`` reuse and purge followed by a new start (no ABA). PostgreSQL uses the sequence
``weft_django_epoch_seq`` (migration 0002); SQLite, which has no sequences, the one-row
``weft_django_epochcounter`` table.

Draw the epoch *after* locking the claim row it goes into: then the order in which transactions
write an id's claim is the order in which they drew its epochs.
"""

from __future__ import annotations

from django.db import connections

SEQUENCE = "weft_django_epoch_seq"
COUNTER_TABLE = "weft_django_epochcounter"

# One statement, race-free: creates the counter row on first use, else increments it.
_SQLITE_NEXT = (
    f"INSERT INTO {COUNTER_TABLE} (id, value) VALUES (1, 1) "
    f"ON CONFLICT (id) DO UPDATE SET value = {COUNTER_TABLE}.value + 1 RETURNING value"
)


def next_epoch_sql(vendor: str) -> str:
    """SQL that draws the next epoch.

    On PostgreSQL an expression (``nextval(...)``) that can be used inline, e.g.
    ``UPDATE ... SET epoch = nextval('weft_django_epoch_seq') ... RETURNING epoch``, or selected.
    Elsewhere a complete statement returning one row with the new value; run it before the statement
    that uses the epoch, in the same transaction.
    """
    if vendor == "postgresql":
        return f"nextval('{SEQUENCE}')"
    return _SQLITE_NEXT


def next_epoch(using: str) -> int:
    """Draw the next epoch on database ``using`` (in its current transaction, if any)."""
    connection = connections[using]
    sql = next_epoch_sql(connection.vendor)
    if connection.vendor == "postgresql":
        sql = f"SELECT {sql}"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    return int(row[0])


__all__ = ["next_epoch", "next_epoch_sql"]
