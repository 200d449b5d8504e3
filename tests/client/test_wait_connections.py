"""The connections of the weft-wait threads: how long a burst of waits leaves them open, and what a
wait does when its own connection is cut (pg_terminate_backend on that thread's backend). Real
PostgreSQL, counted in pg_stat_activity."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.backends.signals import connection_created

import weft_django as weft
from weft_django import client, waits
from weft_django.models import PendingUpdate
from weft_django.testing import running_engine, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def _other_backends() -> int:
    """How many other sessions the test database has (this process's waits, listeners and readers)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def _session(pid: int) -> tuple[str, str, str] | None:
    """(state, wait_event_type, query) of backend ``pid``; None once it is gone. (Fresh also inside a
    transaction, where pg_stat_activity would keep showing its first snapshot.)"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT state, coalesce(wait_event_type, ''), query FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1], row[2])


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


def _wait_thread_pid(pids: list[int], *, doing: Callable[[tuple[str, str, str]], bool]) -> int:
    """The backend of the (one) weft-wait thread's connection, once its session is ``doing``."""
    wait_for(lambda: pids, timeout=30, message="the wait thread's connection")

    def ready() -> bool:
        session = _session(pids[-1])
        return session is not None and doing(session)

    wait_for(ready, timeout=30, message="the wait to be under way on its connection")
    return pids[-1]


def _reading(session: tuple[str, str, str]) -> bool:
    """Idle between the wait's reads (its last statement a read, not the lock-bound setting)."""
    return session[0] == "idle" and "SELECT" in session[2] and "set_config" not in session[2]


def test_a_query_whose_connection_is_cut_goes_on_on_a_new_one(wait_thread_pids):
    """A query() waiting for an engine (none holds the run yet) whose own connection is terminated
    (pg_terminate_backend on that thread's backend, nothing else) reconnects once and goes on: once
    an engine holds the run, it answers. A query only reads the run, so asking it again is safe."""
    client.close_connections()
    weft.start("tests.msg_counter", id="counter")
    thread, outcome = _in_thread(lambda: weft.query("counter", "echo", "hello", timeout="60s"))
    pid = _wait_thread_pid(wait_thread_pids, doing=_reading)
    _terminate([pid])
    with running_engine("after-the-cut"):
        thread.join(60)
    assert outcome == ["hello"]
    assert len(wait_thread_pids) == 2  # the cut one, then one new connection
    client.close_connections()


@pytest.mark.parametrize("key", ["once", None])
def test_an_update_whose_connection_is_cut_after_its_admission_goes_on_waiting(wait_thread_pids, key):
    """An update() admitted and waiting for an engine whose own connection is terminated reconnects
    once and waits on for the same update (it knows its id: nothing is admitted again), with or
    without an idempotency_key: it is applied once."""
    client.close_connections()
    weft.start("tests.msg_counter", id="counter")
    thread, outcome = _in_thread(lambda: weft.update("counter", "add", 2, idempotency_key=key, timeout="60s"))
    wait_for(lambda: PendingUpdate.objects.exists(), timeout=30, message="the admission")
    pid = _wait_thread_pid(wait_thread_pids, doing=_reading)
    _terminate([pid])
    with running_engine("after-the-cut"):
        thread.join(60)
        assert outcome == [2]
        assert weft.query("counter", "calls", timeout="30s") == 1
    assert PendingUpdate.objects.count() == 1
    client.close_connections()


@pytest.mark.parametrize("key", ["once", None])
def test_an_update_whose_connection_is_cut_during_its_admission_is_admitted_once(wait_thread_pids, key):
    """An update() whose connection is terminated while its admission waits for a lock (the table
    locked by another transaction here), so the admission did not commit, admits it again on a new
    connection: it sees that its update (whose id it chose) is not there. Applied once, with or
    without an idempotency_key."""
    client.close_connections()
    weft.start("tests.msg_counter", id="counter")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE weft_django_pendingupdate IN SHARE ROW EXCLUSIVE MODE")
        thread, outcome = _in_thread(lambda: weft.update("counter", "add", 2, idempotency_key=key, timeout="60s"))
        pid = _wait_thread_pid(wait_thread_pids, doing=lambda session: session[1] == "Lock")
        _terminate([pid])
        wait_for(lambda: _session(pid) is None, timeout=30, message="the cut backend to go")
    with running_engine("after-the-cut"):
        thread.join(60)
        assert outcome == [2]
        assert weft.query("counter", "calls", timeout="30s") == 1
    assert PendingUpdate.objects.count() == 1
    client.close_connections()
