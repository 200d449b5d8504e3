"""Engine behaviour the chaos suite found, reduced to minimal reproductions, kept as regression tests
(see docs/reliability.md, Findings).

1. An activity attempt's timeout used to start when the engine created the attempt, before a thread of
   the activity pool picked it up: with more attempts dispatched than threads, the queued ones timed out
   before they started (the full chaos run saw 76 of 300 workflows fail that way with 8 threads per
   engine). Now the timeout measures the attempt's own run time (engine/activities.py, ``start_clock``);
   the queue wait counts only against ``schedule_to_close_timeout``.
2. An engine frozen inside a transaction kept its claim rows locked (below).
"""

from __future__ import annotations

from typing import Any

import pytest

import weft_django as weft
from weft_django.models import Step
from weft_django.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.chaos]


def test_attempts_waiting_for_a_thread_do_not_time_out():
    # One thread, four attempts of 0.2 s each with a 0.5 s timeout: every one fits its timeout.
    handle = weft.start("tests.queued_timeouts", args=[4, 0.2, 0.5], id="queued")
    run_until_idle(timeout=30, concurrency=1)
    failed = list(Step.objects.filter(workflow_id="queued", status="failed").values_list("seq", "error"))
    assert failed == []
    assert handle.result(timeout=5) == [f"queued-{i}" for i in range(4)]


@pytest.mark.chaos_full
@pytest.mark.postgres
@pytest.mark.subprocess
def test_an_engine_frozen_inside_a_transaction_loses_its_claims() -> None:
    """Finding 2. An engine SIGSTOPped while one of its sessions is inside a transaction (the fenced
    commit locks claim rows FOR NO KEY UPDATE first; acquire locks its candidates) kept those row
    locks for as long as it stayed frozen: its socket is still open, so PostgreSQL never ended the
    session, and peers' takeover (``FOR NO KEY UPDATE ... SKIP LOCKED``) skipped exactly those rows.
    A SIGKILLed engine does not have the problem (the server sees the socket close). The engine's
    sessions now run with ``idle_in_transaction_session_timeout`` (and ``lock_timeout``) below the
    claim TTL (engine/sessions.py), so the takeover bound of ARCHITECTURE §3 holds for a frozen engine
    too: the server ends the frozen session and its locks go with it."""
    from tests.chaos.harness import Fault, Plan, run_chaos

    plan = Plan(
        name="frozen",
        workflows=40,
        engines=2,
        faults=[Fault("freeze", 0.2)],
        freeze_when="in_transaction",
        slack_s=10.0,
    )
    figures = run_chaos(plan)
    assert figures["observed"].get("sigstops_inside_a_transaction") == 1
    assert figures["violations"]["no claim held by a dead engine"] == []


def _show(connection: Any, name: str) -> str:
    """The setting in this session, in milliseconds for both timeouts ("0": none)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT setting FROM pg_settings WHERE name = %s", [name])
        return str(cursor.fetchone()[0])


@pytest.mark.postgres
def test_the_engines_sessions_are_bounded_below_the_claim_ttl() -> None:
    """The fix of finding 2, without a cluster: the loop's connection is bounded while the engine runs
    (again after a reconnect), an atomic activity's commit only for its own transaction, and the
    connection gets the server's defaults back when the engine stops."""
    from django.db import connection, transaction

    from weft_django.engine import sessions
    from weft_django.engine.engine import Engine
    from weft_django.store.sessions import bounded_commit

    engine = Engine("bounded-sessions")
    limit = sessions.session_limit(engine.settings)
    assert limit == max(engine.settings.workflow_claim_ttl / 2, sessions.MIN_LIMIT)
    expected = str(int(limit.total_seconds() * 1000))
    default = _show(connection, "idle_in_transaction_session_timeout")
    engine.start()
    try:
        for name in ("idle_in_transaction_session_timeout", "lock_timeout"):
            assert _show(connection, name) == expected
        connection.close()  # a reconnect (after a database error) is bounded again
        assert _show(connection, "lock_timeout") == expected
    finally:
        engine.shutdown()
    assert _show(connection, "idle_in_transaction_session_timeout") == default

    # An atomic activity's transaction: unbounded while the user's code runs, bounded for its commit.
    commit = bounded_commit(lambda: _show(connection, "idle_in_transaction_session_timeout"), "default", limit)
    with transaction.atomic():
        assert _show(connection, "idle_in_transaction_session_timeout") == default
        assert commit() == expected
    assert _show(connection, "idle_in_transaction_session_timeout") == default


def test_an_attempt_waits_for_a_thread_without_a_deadline_and_is_skipped_if_stopped_meanwhile() -> None:
    """The pool's side of finding 1: a queued attempt has no deadline yet; it gets one when a thread
    starts it; one stopped while queued (its workflow finished, was deposed) never runs."""
    import json
    import threading
    import time
    from datetime import timedelta

    from django.utils import timezone

    from weft_django.engine.activities import AttemptTask, ThreadExecutor
    from weft_django.registry import ActivityDefinition, RetryPolicy

    release = threading.Event()
    ran: list[str] = []

    def work(name: str) -> str:
        ran.append(name)
        release.wait(10)
        return name

    definition = ActivityDefinition(work, "tests.pool_work", RetryPolicy(), timeout=timedelta(seconds=30))
    pool = ThreadExecutor(1, lambda: None, lambda task, text: None, "default")

    def task(seq: int, name: str) -> AttemptTask:
        args = json.dumps({"args": [name]})
        return AttemptTask("w", "r", seq, 1, 1, definition, args, timezone.now(), deadline=0.0)

    first, queued, stopped = task(1, "first"), task(2, "queued"), task(3, "stopped")
    for each in (first, queued, stopped):
        pool.submit(each)
    try:
        for _ in range(500):
            if ran:
                break
            time.sleep(0.01)
        assert ran == ["first"]
        assert first.deadline is not None  # started: its clock runs
        assert queued.deadline is None and stopped.deadline is None  # waiting for the one thread
        stopped.control.request_stop("the workflow finished")
        release.set()
        outcomes = [pool.outcomes.get(timeout=10), pool.outcomes.get(timeout=10)]
        assert [(o.task.seq, o.ok) for o in outcomes] == [(1, True), (2, True)]
        for _ in range(500):
            if not pool.running:
                break
            time.sleep(0.01)
        assert pool.running == [] and ran == ["first", "queued"]
    finally:
        release.set()
        pool.shutdown(0)
