"""SQLite's limit on the parameters of one statement (SQLITE_LIMIT_VARIABLE_NUMBER), lowered for a test.

SQLite refuses a statement binding more parameters than the limit ("too many SQL variables"). The limit
is 32,766 by default since SQLite 3.32.0 (250,000 in Debian's builds) and 999 before (Django 5.2 still
supports SQLite 3.31). A test that drove 33,000 ids through every path would take minutes, so the tests
lower the limit to 999 with ``setlimit`` on the raw sqlite3 connections (the test's and every one opened
meanwhile: an in-process engine's threads) and pass about 1,100 ids: the same statement fails the same
way, with 33 times fewer rows. Python 3.11+ (``getlimit``/``setlimit``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created

LIMIT = 999
# Over the limit, with room: a statement binding one parameter per id is refused.
OVER = 1100


def _lower(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "sqlite":
        connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, LIMIT)


@contextmanager
def lowered_param_limit() -> Iterator[None]:
    """Every SQLite connection of this process binds at most LIMIT parameters per statement meanwhile."""
    connection = connections["default"]
    connection.ensure_connection()
    before = connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, LIMIT)
    connection_created.connect(_lower)
    try:
        yield
    finally:
        connection_created.disconnect(_lower)
        if connection.connection is not None:
            connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)
