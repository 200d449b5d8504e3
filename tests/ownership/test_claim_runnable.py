"""WorkflowClaim.runnable: False exactly while a run is terminal or suspended, so that acquire reads
only the partial index of claimable rows; every path that makes a run active again sets it back
(a missed one would strand the workflow)."""

from __future__ import annotations

from datetime import timedelta

import pytest

import weft_django as weft
from weft_django import transitions
from weft_django.engine import ownership
from weft_django.models import Workflow, WorkflowClaim

pytestmark = pytest.mark.django_db(transaction=True)

GATE = {"open": False}
TTL, RENEW = timedelta(seconds=30), timedelta(seconds=5)


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def runnable_gate(key: str) -> str:
    if not GATE["open"]:
        raise RuntimeError("the gate is closed")
    return key


@weft.workflow(name="runnable_tests.gated")
def gated(ctx, key: str):
    value = yield ctx.run(runnable_gate, key)
    return value


@weft.workflow(name="runnable_tests.parks")
def parks(ctx):
    payload = yield ctx.wait_for_signal("go")
    return payload


@pytest.fixture(autouse=True)
def _closed_gate():
    GATE["open"] = False
    yield
    GATE["open"] = False


def runnable(workflow_id: str) -> bool:
    return WorkflowClaim.objects.get(pk=workflow_id).runnable


def test_terminal_runs_are_not_runnable_and_retried_or_reused_ones_are(weft_run_until_idle):
    done = weft.start(gated, args=["a"], id="rn-done")
    assert runnable("rn-done")
    GATE["open"] = True
    weft_run_until_idle(engine_id="rn-1")
    assert done.status == "completed" and not runnable("rn-done")

    # A failed run (engine's terminal commit) is not runnable; retry makes it runnable and it completes.
    GATE["open"] = False
    again = weft.start(gated, args=["c"], id="rn-failed-2")
    weft_run_until_idle(engine_id="rn-2")
    assert again.status == "failed" and not runnable("rn-failed-2")
    GATE["open"] = True
    again.retry()
    assert runnable("rn-failed-2")
    weft_run_until_idle(engine_id="rn-3")
    assert again.status == "completed" and again.result(timeout=5) == "c"

    # A reused id (on_conflict="start_new" over a terminal run) is runnable and completes.
    reused = weft.start(gated, args=["d"], id="rn-done", on_conflict="start_new")
    assert runnable("rn-done")
    weft_run_until_idle(engine_id="rn-4")
    assert reused.status == "completed" and reused.result(timeout=5) == "d" and not runnable("rn-done")

    # A leftover claim of a finished run whose workflow row is gone: a start over that id takes it again.
    Workflow.objects.filter(pk="rn-done").delete()
    assert WorkflowClaim.objects.filter(pk="rn-done", runnable=False).exists()
    fresh = weft.start(gated, args=["e"], id="rn-done")
    assert runnable("rn-done")
    weft_run_until_idle(engine_id="rn-5")
    assert fresh.status == "completed" and fresh.result(timeout=5) == "e"


def test_external_transitions_maintain_runnable(weft_run_until_idle):
    handle = weft.start(parks, id="rn-parked")
    weft_run_until_idle(engine_id="rn-6")  # parks on the signal; the claim is released
    assert handle.status == "running" and runnable("rn-parked")
    handle.suspend()
    assert not runnable("rn-parked")
    handle.resume()
    assert runnable("rn-parked")
    handle.cancel()
    assert not runnable("rn-parked")
    timed = weft.start(parks, id="rn-timed")
    transitions.time_out("rn-timed")
    assert timed.status == "timed_out" and not runnable("rn-timed")
    reused = weft.start(parks, id="rn-timed", on_conflict="start_new")
    assert runnable("rn-timed")
    reused.signal("go", 7)
    weft_run_until_idle(engine_id="rn-7")
    assert reused.result(timeout=5) == 7 and not runnable("rn-timed")


def test_acquire_never_picks_a_terminal_or_suspended_run(weft_run_until_idle):
    GATE["open"] = True
    weft.start(gated, args=["x"], id="rn-x")
    weft_run_until_idle(engine_id="rn-8")
    weft.start(parks, id="rn-susp").suspend()
    weft.start(parks, id="rn-cancelled").cancel()
    waiting = weft.start(parks, id="rn-waiting")
    # Even with a stale flag left on a terminal run's claim, the workflow's status still decides.
    WorkflowClaim.objects.filter(pk="rn-cancelled").update(runnable=True)
    got = ownership.acquire("rn-probe", limit=10, ttl=TTL, renew_interval=RENEW, using="default")
    assert set(got) == {"rn-waiting"}
    assert ownership.acquire("rn-probe", limit=10, ttl=TTL, renew_interval=RENEW, using="default") == {}
    ownership.release("rn-probe", {wid: epoch for wid, (epoch, _) in got.items()}, "default")
    waiting.signal("go", 1)
    weft_run_until_idle(engine_id="rn-9")
    assert waiting.result(timeout=5) == 1


def test_acquire_is_fifo_among_claimable_runs():
    for i in range(5):
        weft.start(parks, id=f"rn-fifo-{i}")
    first = ownership.acquire("rn-a", limit=2, ttl=TTL, renew_interval=RENEW, using="default")
    second = ownership.acquire("rn-b", limit=10, ttl=TTL, renew_interval=RENEW, using="default")
    assert set(first) == {"rn-fifo-0", "rn-fifo-1"}
    assert set(second) == {"rn-fifo-2", "rn-fifo-3", "rn-fifo-4"}
