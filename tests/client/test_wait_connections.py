"""The connections of the weft-wait threads: how long a burst of waits leaves them open, and what a
wait does when its own connection is cut (pg_terminate_backend on that thread's backend). Real
PostgreSQL, counted in pg_stat_activity."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

import weft_django as weft
from weft_django import client, waits
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def _other_backends() -> int:
    """How many other sessions the test database has (this process's waits, listeners and readers)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def _terminate(pids: list[int]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])


@pytest.fixture
def wait_thread_pids() -> Iterator[list[int]]:
    """The backend pids of the Django connections weft-wait threads open (not the listener's)."""
    pids: list[int] = []

    def record(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread().name.startswith("weft-wait_"):
            pids.append(connection.connection.info.backend_pid)

    connection_created.connect(record, dispatch_uid="wait-thread-pids")
    try:
        yield pids
    finally:
        connection_created.disconnect(dispatch_uid="wait-thread-pids")


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_burst_of_waits_leaves_no_connection_once_they_linger_out(wait_thread_pids):
    """A burst of 16 query() and update() waits at once (no engine: each waits out its timeout) opens
    one Django connection per weft-wait thread; once the waits end and WAIT_CONNECTION_IDLE passes,
    the process holds no connection it did not hold before (no close_connections() needed)."""
    client.close_connections()
    weft.start("tests.msg_counter", id="counter")
    before = _other_backends()

    def query() -> Any:
        return weft.query("counter", "calls", timeout="1s")

    def update() -> Any:
        return weft.update("counter", "add", 1, timeout="1s")

    started = [_in_thread(query if n % 2 else update) for n in range(16)]
    for thread, _ in started:
        thread.join(60)
    outcomes = [outcome[0] for _, outcome in started]
    assert all(isinstance(o, weft.QueryTimeoutError | weft.UpdateTimeoutError) for o in outcomes), outcomes
    assert len(set(wait_thread_pids)) >= 2  # the burst did use several threads' connections
    linger = getattr(waits, "WAIT_CONNECTION_IDLE", 10.0)
    wait_for(
        lambda: _other_backends() <= before,
        timeout=linger + 30,
        message=f"the weft-wait connections to close once idle (left: {_other_backends() - before})",
    )
    # ... and the next wait still works, on a new connection.
    with pytest.raises(weft.QueryTimeoutError):
        weft.query("counter", "calls", timeout="0.2s")
    client.close_connections()
