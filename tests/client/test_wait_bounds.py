"""Waiting calls end at their timeout whatever keeps them from their answer: every weft-wait thread
busy with other waits, a row lock held by the caller's own open transaction. And result() in the
transaction that started a run over a finished one does not answer with the finished run's end."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction

import weft_django as weft
from weft_django import client, waits
from weft_django.models import PendingUpdate, Workflow
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FEW_THREADS = 3  # the weft-wait pool of these tests (WAIT_THREADS, 64, otherwise)


def _outcome_of(call: Callable[[], Any]) -> tuple[threading.Thread, list[object]]:
    """``call()`` on a thread of its own (started): the thread and its outcome (value or exception)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # the outcome is what the test looks at
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _caller_pid() -> int:
    """The PostgreSQL backend of this thread's connection (the caller's transaction)."""
    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


def _end_if_stuck(thread: threading.Thread, pid: list[int]) -> None:
    """Before the fix the caller never returned: end its transaction (its backend), which frees the lock
    its wait waited for, so that close_connections() does not wait for ever for that wait's thread."""
    if thread.is_alive() and pid:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid[0]])
        thread.join(30)


@pytest.fixture
def busy_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[threading.Thread]]:
    """A weft-wait pool of FEW_THREADS threads, each held by a result() without a timeout on a run
    that never ends; closed (and the pool's size restored) afterwards."""
    client.close_connections()
    monkeypatch.setattr(waits, "WAIT_THREADS", FEW_THREADS)
    handle = weft.start("tests.signals", id="never-ends")
    blockers = [_outcome_of(handle.result)[0] for _ in range(FEW_THREADS)]
    wait_for(lambda: len(waits._open_waits) == FEW_THREADS, timeout=30, message="every thread to be waiting")
    try:
        yield blockers
    finally:
        client.close_connections()
        for blocker in blockers:
            blocker.join(30)


def test_a_wait_queued_behind_busy_threads_ends_at_its_timeout(busy_pool):
    """Before the fix the caller waited for its future without a bound and the wait's own deadline
    started when a thread took it: with every thread held by an untimed result(), query(timeout=),
    update(timeout=) and result(timeout=) never returned (nor aresult(timeout=)), until a thread
    came free. Now each raises its typed timeout error at its deadline, saying the threads were
    busy, and an update that never started wrote nothing."""
    weft.start("tests.msg_counter", id="counter")

    async def aresult() -> Any:
        return await weft.get_handle("counter").aresult(timeout=0.3)

    calls: dict[str, Callable[[], Any]] = {
        "query": lambda: weft.query("counter", "count", timeout="0.3s"),
        "update": lambda: weft.update("counter", "add", 1, timeout="0.3s"),
        "result": lambda: weft.get_handle("counter").result(timeout=0.3),
        "aresult": lambda: asyncio.run(aresult()),
    }
    waiting = {name: _outcome_of(call) for name, call in calls.items()}
    for thread, _ in waiting.values():
        thread.join(20)
    outcomes = {name: outcome[0] if outcome else "still waiting" for name, (_, outcome) in waiting.items()}
    assert all(blocker.is_alive() for blocker in busy_pool)  # the threads were busy all along
    expected = {
        "query": weft.QueryTimeoutError,
        "update": weft.UpdateTimeoutError,
        "result": weft.WaitTimeoutError,
        "aresult": weft.WaitTimeoutError,
    }
    assert [name for name, error in expected.items() if not isinstance(outcomes[name], error)] == [], outcomes
    for outcome in outcomes.values():
        assert f"{FEW_THREADS} weft-wait threads" in str(outcome) and "busy" in str(outcome)
    assert not PendingUpdate.objects.exists()  # the update that never started was never admitted


def test_close_connections_gives_a_queued_wait_a_timeout_error(busy_pool):
    """Before the fix a result() still queued when close_connections() shut the pool got
    concurrent.futures.CancelledError; ADR 0006 promises its caller TimeoutError."""
    queued, outcome = _outcome_of(weft.get_handle("never-ends").result)
    wait_for(lambda: waits.wait_executor()._work_queue.qsize() == 1, timeout=30, message="the wait to queue")
    client.close_connections()
    queued.join(30)
    assert outcome and isinstance(outcome[0], weft.WaitTimeoutError), outcome
    assert "close_connections()" in str(outcome[0])


@pytest.mark.postgres
def test_start_with_update_after_a_start_in_the_callers_transaction_ends_at_its_timeout():
    """start_with_update() starts the run on its own connection: after start() of the same id in the
    caller's open transaction its insert waited for that transaction, and its caller waited for it,
    for ever (timeout="1s"). Now the wait's statements give up on a lock at its timeout:
    UpdateTimeoutError saying why, and nothing of it is written when the caller rolls back."""

    pid: list[int] = []

    def body() -> Any:
        pid.append(_caller_pid())
        with transaction.atomic():
            weft.start("tests.msg_counter", id="started-here")
            try:
                return weft.start_with_update("tests.msg_counter", "add", 1, id="started-here", timeout="1s")
            finally:
                transaction.set_rollback(True)

    thread, outcome = _outcome_of(body)
    thread.join(20)
    try:
        assert outcome, "start_with_update() still waits, past its timeout"
        assert isinstance(outcome[0], weft.UpdateTimeoutError), outcome
        assert "locked" in str(outcome[0]) and "transaction" in str(outcome[0])
        assert not Workflow.objects.filter(pk="started-here").exists()
    finally:
        _end_if_stuck(thread, pid)
        client.close_connections()


@pytest.mark.postgres
def test_an_update_whose_row_the_callers_transaction_locked_ends_at_its_timeout():
    """An update admitted with an idempotency key, then, in the caller's transaction, cancel() (which
    fails the run's open updates: their rows stay locked until it ends) and update() again with that
    key: its wait found the update open, tried to expire it at its deadline and waited for the
    caller's lock, its caller for it, for ever. Now UpdateTimeoutError at the timeout."""
    weft.start("tests.msg_counter", id="locked")
    first, _ = _outcome_of(lambda: weft.update("locked", "add", 1, idempotency_key="k", timeout="30s"))
    wait_for(lambda: PendingUpdate.objects.filter(workflow_id="locked").exists(), timeout=30, message="admission")

    pid: list[int] = []

    def body() -> Any:
        pid.append(_caller_pid())
        with transaction.atomic():
            weft.get_handle("locked").cancel("in the caller's transaction")
            try:
                return weft.update("locked", "add", 1, idempotency_key="k", timeout="1s")
            finally:
                transaction.set_rollback(True)

    thread, outcome = _outcome_of(body)
    thread.join(20)
    try:
        assert outcome, "update() still waits, past its timeout"
        assert isinstance(outcome[0], weft.UpdateTimeoutError), outcome
        assert "locked" in str(outcome[0]) and "idempotency_key" in str(outcome[0])
    finally:
        _end_if_stuck(thread, pid)
        client.close_connections()
        first.join(30)


@pytest.mark.parametrize("how", ["start_new", "start_or_signal"])
def test_result_in_the_transaction_that_started_a_run_over_a_finished_one_is_not_the_old_end(how, weft_run_until_idle):
    """result() reads committed data on its own connection: after a start over a finished run in the
    caller's open transaction it read the finished run and answered with its end ({'total': 3}),
    where the docs promise WorkflowNotFoundError for a run started in an uncommitted transaction."""
    handle = weft.start("tests.sum", args=[1, 2], id="again")
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"total": 3}
    with transaction.atomic():
        if how == "start_new":
            weft.start("tests.sum", args=[10, 20], id="again", on_conflict="start_new")
        else:
            weft.start_or_signal("tests.sum", "ignored", args=[10, 20], id="again")
        with pytest.raises(weft.WorkflowNotFoundError, match="has not committed"):
            handle.result(timeout=2)
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"total": 30}  # once committed, the new run's end
