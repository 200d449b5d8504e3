"""Fencing epochs: one global, strictly increasing series shared by every workflow id.

Drawing every epoch from one series means an id's epoch never repeats or goes down, across release,
``start_new`` reuse and purge followed by a new start (no ABA). PostgreSQL uses the sequence
``weft_django_epoch_seq`` (migration 0002); SQLite, which has no sequences, the one-row
``weft_django_epochcounter`` table. The two spellings are methods of the backends
(``Backend.next_epoch_sql`` and ``Backend.select_next_epoch_sql``).

Draw the epoch *after* locking the claim row it goes into: then the order in which transactions
write an id's claim is the order in which they drew its epochs.
"""

from __future__ import annotations

from .backend import _BACKENDS, COUNTER_TABLE, SEQUENCE, backend

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


def next_epoch_sql(vendor: str) -> str:
    """SQL that draws the next epoch on a database of ``vendor`` ("postgresql" or "sqlite").

    On PostgreSQL an expression (``nextval(...)``) that can be used inline, e.g.
    ``UPDATE ... SET epoch = nextval('weft_django_epoch_seq') ... RETURNING epoch``, or selected.
    Elsewhere a complete statement returning one row with the new value; run it before the statement
    that uses the epoch, in the same transaction.

    Raises:
        KeyError: ``vendor`` is not a supported database.
    """
    return _BACKENDS[vendor].next_epoch_sql()


def next_epoch(using: str) -> int:
    """Draw the next epoch on database ``using`` (in its current transaction, if any).

    Args:
        using: the connection alias.

    Raises:
        django.db.DatabaseError: the statement failed.
    """
    found = backend(using)
    with found.connection.cursor() as cursor:
        cursor.execute(found.select_next_epoch_sql())
        row = cursor.fetchone()
    return int(row[0])


def next_epochs(count: int, using: str) -> list[int]:
    """Draw ``count`` epochs on database ``using``, in increasing order: one statement on PostgreSQL
    (``nextval`` over a series), ``next_epoch`` each elsewhere (SQLite: its counter row, locally).

    Raises:
        django.db.DatabaseError: the statement failed.
    """
    found = backend(using)
    if not found.batches_statements:
        return [next_epoch(using) for _ in range(count)]
    with found.connection.cursor() as cursor:
        cursor.execute(f"SELECT {found.next_epoch_sql()} FROM generate_series(1, %s) ORDER BY 1", [count])
        return [int(row[0]) for row in cursor.fetchall()]


__all__ = ["COUNTER_TABLE", "SEQUENCE", "next_epoch", "next_epoch_sql", "next_epochs"]
