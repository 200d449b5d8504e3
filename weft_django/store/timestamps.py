"""Timestamp columns read where a hand edit may have put a value out of Python's reach.

PostgreSQL keeps timestamps from 4713 BC to year 294276 and +-infinity; psycopg raises DataError while
converting one before year 1 or past year 9999, which fails the whole read (every row of it). The
engine's loads turn that into ``UnreadableRow`` (store/histories.py: the run is made stuck). The other
readers that only need such a column on the side (the outcome a Celery worker committed, what
``result()`` and a task's ``get_result()`` show) select it through ``readable``: the value where Python
can hold it, else NULL, so the rest of the row, and every other row, reads as usual.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db.models import Case, DateTimeField, F, When

FIRST = datetime(1, 1, 1, tzinfo=UTC)
LAST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


def readable(column: str) -> Case:
    """An ORM expression: ``column`` where a Python datetime can hold it, else NULL."""
    return Case(When(**{f"{column}__range": (FIRST, LAST)}, then=F(column)), default=None, output_field=DateTimeField())


def readable_sql(column: str) -> tuple[str, list[datetime]]:
    """``readable`` as raw SQL for a SELECT list, with its parameters."""
    return f"CASE WHEN {column} BETWEEN %s AND %s THEN {column} END", [FIRST, LAST]
