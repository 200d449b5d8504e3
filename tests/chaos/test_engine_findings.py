"""Engine behaviour the chaos suite found, reduced to minimal reproductions (see docs/reliability.md).

An activity attempt's timeout clock starts when the engine creates the attempt
(weft_django/engine/progress.py, ``_task``: ``deadline=time.monotonic() + timeout``), before the commit
that records it and before a thread of the activity pool picks it up. When more attempts are dispatched
than the pool has threads, the queued ones time out before they start, although each takes far less
than its timeout; their retries queue again, so a burst can exhaust every attempt and fail the workflow
(the full chaos run saw 76 of 300 workflows fail this way with 8 threads per engine). The timed-out
attempts still run later, after their step was settled. Expected: the timeout measures the attempt's
own run time (start-to-close); a queue wait should at most count against ``schedule_to_close_timeout``.
"""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django.models import Step
from weft_django.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.chaos]


@pytest.mark.xfail(reason="attempt timeouts count the wait for a free activity thread (engine/progress.py _task)")
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
@pytest.mark.xfail(reason="a SIGSTOPped engine inside a transaction keeps its claim rows locked (SKIP LOCKED)")
def test_an_engine_frozen_inside_a_transaction_loses_its_claims() -> None:
    """Finding 2. An engine SIGSTOPped while one of its sessions is inside a transaction (the fenced
    commit locks claim rows FOR NO KEY UPDATE first; acquire locks its candidates) keeps those row
    locks for as long as it stays frozen: its socket is still open, so PostgreSQL never ends the
    session. Peers take claims over with ``FOR NO KEY UPDATE ... SKIP LOCKED`` (engine/ownership.py,
    ``acquire``), so they skip exactly those rows, and the frozen engine's workflows stay stuck past
    TTL + grace, for as long as the freeze lasts (a VM pause, a debugger, a swap storm). A SIGKILLed
    engine does not have the problem (the server sees the socket close and rolls back). Expected: the
    takeover bound of ARCHITECTURE §3 holds for a frozen engine too, e.g. with
    ``idle_in_transaction_session_timeout`` (and a ``statement_timeout``/``lock_timeout``) on the
    engine's sessions set below the claim TTL."""
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
