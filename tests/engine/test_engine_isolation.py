"""The engine's sessions run READ COMMITTED whatever isolation level the project configured.

weft uses the project's database alias. A project may set ``OPTIONS["isolation_level"]`` (Django:
psycopg then begins every transaction at that level) or a server or role default
(``default_transaction_isolation``). The engine's fences, claims and queue admissions are written for
READ COMMITTED: an UPDATE of a row a peer changed meanwhile re-reads it, and a statement sees what
committed before it. Under REPEATABLE READ or SERIALIZABLE such a row fails the transaction with a
serialization error instead, and an admission counts from a snapshot taken before its lock. Before the
fix the engine's transactions ran at the project's level; ``store/sessions.py`` now sets READ
COMMITTED on the engine's own sessions (and gives the connection its level back at shutdown)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from psycopg import IsolationLevel

import weft_django as weft
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _level(*, atomic: bool) -> str:
    if atomic:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SHOW transaction_isolation")
            return str(cursor.fetchone()[0])
    with connection.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        return str(cursor.fetchone()[0])


@pytest.fixture
def project_options() -> Iterator[dict[str, Any]]:
    """The default connection's OPTIONS, restored (and the connection reopened) afterwards."""
    if connection.vendor != "postgresql":
        pytest.skip("isolation levels of PostgreSQL")
    saved = dict(connection.settings_dict["OPTIONS"])
    connection.close()
    try:
        yield connection.settings_dict["OPTIONS"]
    finally:
        connection.close()
        connection.settings_dict["OPTIONS"] = saved
        connection.close()


@pytest.mark.parametrize(
    ("option", "value", "level"),
    [
        ("isolation_level", IsolationLevel.REPEATABLE_READ, "repeatable read"),
        ("isolation_level", IsolationLevel.SERIALIZABLE, "serializable"),
        ("options", "-c default_transaction_isolation=serializable", "serializable"),
    ],
    ids=["options-repeatable-read", "options-serializable", "server-default-serializable"],
)
def test_the_engines_sessions_are_read_committed_whatever_the_project_set(
    project_options: dict[str, Any], option: str, value: Any, level: str
) -> None:
    project_options[option] = value
    assert _level(atomic=True) == level  # the project's own transactions, before and after the engine
    engine = Engine("isolation", concurrency=2)
    engine.start()  # binds the loop's thread (this one) and its connection
    try:
        assert _level(atomic=True) == "read committed", "the engine's transactions run at the project's level"
        assert _level(atomic=False) == "read committed", "the engine's single statements run at the project's level"
        handle = weft.start("tests.signal_then_local", id="isolation-0")
        tick_until(engine, lambda: handle.id in engine.owned, "held")
        handle.signal("go", "payload")
        tick_until(engine, lambda: handle.describe()["status"] == "completed", "its end")
        assert handle.result(timeout=1) == "payload"
        connection.close()  # a reconnect of the engine's thread gets the same settings
        assert _level(atomic=True) == "read committed"
    finally:
        engine.shutdown()
    assert _level(atomic=True) == level, "the connection did not get the project's level back at shutdown"
