"""What a waiting call leaves behind: cancelled coroutines (astart, aresult, aupdate), many waits at
once, and connections cut under a wait. Real PostgreSQL (and SQLite where no connection is counted)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.db import connection

import weft_django as weft
from weft_django import client, signals, waits
from weft_django.models import PendingUpdate, Workflow
from weft_django.testing import running_engine, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _other_backends() -> list[str]:
    """The test database's other sessions (this process's waits, listeners and readers)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall()]


def _terminate_other_backends() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def _waits_ended() -> None:
    wait_for(lambda: not waits._open_waits, timeout=30, message="every wait to end")


async def _cancelled(coroutine: Any) -> None:
    """Run ``coroutine`` until it waits, then cancel it (as asyncio.wait_for does at its timeout)."""
    task = asyncio.ensure_future(coroutine)
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.postgres
def test_cancelled_aresult_waits_leave_no_connection_or_busy_thread():
    """Proven fine: 60 aresult() cancelled mid-wait (task.cancel(), asyncio.wait_for's timeout) end
    their waits, and once the shared LISTEN and reader connections linger out, the process holds
    no connection it did not hold before."""
    client.close_connections()
    handle = weft.start("tests.signals", id="never-ends")
    before = len(_other_backends())

    async def scenario() -> None:
        for _ in range(30):
            await _cancelled(handle.aresult(timeout=30))
        for _ in range(30):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(handle.aresult(), timeout=0.02)

    asyncio.run(scenario())
    _waits_ended()
    wait_for(lambda: len(_other_backends()) <= before, timeout=30, message="the wait connections to close")


def test_a_cancelled_aupdate_is_expired_and_never_applied():
    """Proven fine (documented now): cancelling aupdate() ends its wait as its timeout would: an
    update no engine applied yet is expired, and an engine that comes later does not apply it."""
    weft.start("tests.msg_counter", id="counter")

    async def scenario() -> None:
        await _cancelled(weft.get_handle("counter").aupdate("add", 5, timeout="30s"))

    asyncio.run(scenario())
    wait_for(lambda: PendingUpdate.objects.filter(status="expired").count() == 1, timeout=30, message="expiry")
    with running_engine("after-the-cancel"):
        assert weft.update("counter", "add", 1, timeout="30s") == 1  # 1, not 6: the first was never applied
    client.close_connections()


def test_a_cancelled_astart_may_still_start_its_run():
    """Pinned (documented now): astart() runs start() on a thread that a cancelled coroutine cannot
    stop, so a start cancelled mid-call still commits; its caller got CancelledError. Pass an id or
    an idempotency_key and start again to find the run."""
    entered, release = threading.Event(), threading.Event()

    def hold(sender: Any, **kwargs: Any) -> None:
        entered.set()
        release.wait(30)

    async def scenario() -> None:
        task = asyncio.ensure_future(weft.astart("tests.signals", idempotency_key="order-1"))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()

    signals.workflow_started.connect(hold, dispatch_uid="hold-the-start")
    try:
        asyncio.run(scenario())
    finally:
        release.set()
        signals.workflow_started.disconnect(dispatch_uid="hold-the-start")
    wait_for(lambda: Workflow.objects.exists(), timeout=30, message="the start to commit")
    again = weft.start("tests.signals", idempotency_key="order-1")
    assert list(Workflow.objects.values_list("id", flat=True)) == [again.id]


def test_many_concurrent_waits_each_get_their_runs_result(weft_run_until_idle):
    """Proven fine: 100 waits at once, more than the WAIT_THREADS weft-wait threads (50 result() on
    threads, 50 aresult() on one event loop), each get their own run's result; afterwards no wait is
    left and, on PostgreSQL, no connection."""
    client.close_connections()  # no wait connection kept from an earlier test
    handles = [weft.start("tests.sum", args=[n, 1000]) for n in range(50)]
    before = len(_other_backends()) if connection.vendor == "postgresql" else 0
    results: dict[str, Any] = {}

    def wait(handle: Any) -> None:
        results[f"sync {handle.id}"] = handle.result(timeout=120)

    async def await_all() -> None:
        values = await asyncio.gather(*(handle.aresult(timeout=120) for handle in handles))
        results.update({f"async {h.id}": value for h, value in zip(handles, values, strict=True)})

    threads = [threading.Thread(target=wait, args=[handle]) for handle in handles]
    threads.append(threading.Thread(target=asyncio.run, args=[await_all()]))
    for thread in threads:
        thread.start()
    weft_run_until_idle()
    for thread in threads:
        thread.join(120)
    expected = {f"{how} {h.id}": {"total": n + 1000} for n, h in enumerate(handles) for how in ("sync", "async")}
    assert results == expected
    _waits_ended()
    if connection.vendor == "postgresql":
        wait_for(lambda: len(_other_backends()) <= before, timeout=30, message="the wait connections to close")


def test_many_waits_past_their_timeout_each_raise_the_typed_timeout(monkeypatch):
    """Proven fine with the fix of test_wait_bounds: 40 aresult(timeout=0.3) at once on a run that does
    not end, on a pool of 8 threads, all raise WaitTimeoutError (a TimeoutError) saying what to do:
    those that never got a thread say so, those that waited 'call result() again'.

    The pool's threads are held on a gate while the 40 wait, so none of them gets a thread whatever
    the machine's load (a thread freed at the deadline used to take a queued wait before its caller's
    timer withdrew it: all 40 then said 'still running', none 'busy'); then, the gate open, waits that
    get a thread each say the run is still running."""
    client.close_connections()
    monkeypatch.setattr(waits, "WAIT_THREADS", 8)
    handle = weft.start("tests.signals", id="never-ends")
    gate, holding = threading.Event(), threading.Semaphore(0)

    def hold_a_thread() -> None:
        holding.release()
        gate.wait(30)

    async def scenario(n: int) -> list[BaseException]:
        return await asyncio.gather(*(handle.aresult(timeout=0.3) for _ in range(n)), return_exceptions=True)

    try:
        held = [waits.wait_executor().submit(hold_a_thread) for _ in range(8)]
        for _ in held:
            assert holding.acquire(timeout=30), "the pool's threads did not start"
        queued = asyncio.run(scenario(40))
        gate.set()
        for future in held:
            future.result(timeout=30)
        started = asyncio.run(scenario(4))
    finally:
        gate.set()
        client.close_connections()
    outcomes = queued + started
    assert all(isinstance(o, weft.WaitTimeoutError) and isinstance(o, TimeoutError) for o in outcomes), outcomes
    assert all("result() again" in str(o) for o in outcomes)
    assert all("8 weft-wait threads" in str(o) for o in queued), queued
    assert all("is still running" in str(o) for o in started), started


@pytest.mark.postgres
def test_a_result_wait_outlives_its_listen_and_reader_connections_being_terminated():
    """Proven fine: pg_terminate_backend on the LISTEN and reader connections under a result() wait;
    the listener reconnects (polling meanwhile) and the wait returns the run's result."""
    client.close_connections()  # no wait connection kept from an earlier test
    handle = weft.start("tests.signals", id="cut")
    waiting: list[Any] = []
    thread = threading.Thread(target=lambda: waiting.append(handle.result(timeout=60)))
    thread.start()
    listener = waits.listener_for("default")
    assert listener is not None
    wait_for(lambda: listener.listening.is_set() and listener._reader, timeout=30, message="LISTEN and the reader")
    _terminate_other_backends()
    with running_engine("after-the-cut"):
        handle.signal("go", "through")
        thread.join(60)
    assert waiting == ["through"]
    client.close_connections()


@pytest.mark.postgres
def test_an_update_wait_whose_connections_are_terminated_goes_on_and_applies_once():
    """An update() waiting for an engine whose connections (its own, the LISTEN and reader ones) are
    all terminated reconnects (its own once, test_wait_connections.py) and goes on waiting for the
    same update; an engine that comes later applies it, once (it used to raise the DatabaseError at
    once). Sent again with its idempotency_key it is the same update."""
    weft.start("tests.msg_counter", id="counter")
    outcome: list[object] = []

    def send() -> None:
        try:
            outcome.append(weft.update("counter", "add", 2, idempotency_key="once", timeout="60s"))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    wait_for(lambda: PendingUpdate.objects.exists(), timeout=30, message="the admission")
    _terminate_other_backends()
    with running_engine("after-the-cut"):
        thread.join(60)
        assert outcome == [2], outcome
        assert weft.update("counter", "add", 2, idempotency_key="once", timeout="30s") == 2
        assert PendingUpdate.objects.count() == 1
    client.close_connections()
