"""Local activities (``local=True``) under conditions the first tests did not reach (a helper's review)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.models import Timer
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)


@weft.activity(name="tests.lf_add_one", local=True)
def lf_add_one(n: int) -> int:
    return n + 1


@weft.workflow(name="tests.lf_many_local")
def lf_many_local(ctx: Any, count: int) -> Any:
    total = 0
    for _ in range(count):
        total = yield ctx.run(lf_add_one, total)
    return total


def test_a_workflow_with_more_local_steps_than_one_pass_settles_completes() -> None:
    """Each local step is one round of the pass's settle cascade. A workflow whose local steps
    outnumber the cascade's rounds (1,000) must go on in a later pass, not be left at an unarmed
    frontier with nothing that would ever arm it."""
    handle = weft.start(lf_many_local, args=[1200], id="lf-many")
    engine = Engine("lf-many", concurrency=2)
    engine.run_until_idle(timeout=60)
    assert handle.describe()["status"] == "completed"
    assert handle.result(timeout=5) == 1200


@weft.activity(name="tests.lf_slow", local=True)
def lf_slow(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


@weft.workflow(name="tests.lf_slow_then_wait")
def lf_slow_then_wait(ctx: Any) -> Any:
    yield ctx.run(lf_slow, 1.5)
    try:
        return (yield ctx.wait_for_signal("go", timeout="1s"))
    except weft.WaitTimeoutError:
        return "timed out"


def test_a_wait_after_a_slow_local_step_gets_its_whole_timeout() -> None:
    """A wait armed right after a local step that took 1.5 s gets its 1 s from when it began, not
    from the start of the pass that ran the local step (it was due before it was even armed)."""
    signalled_as_its_wait_is_armed(lf_slow_then_wait, "lf-wait")


def signalled_as_its_wait_is_armed(workflow: Any, workflow_id: str, check: Any = None) -> None:
    """Run ``workflow`` on an in-process engine, signal "go" as soon as its wait's timer exists, and
    check it got the signal in time (then ``check()``, while the engine still runs)."""
    handle = weft.start(workflow, id=workflow_id)
    engine = Engine(workflow_id, concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: Timer.objects.filter(workflow_id=workflow_id).exists(), "the wait's timer")
        weft.signal(workflow_id, "go", "in time")  # at once: well within the wait's second
        tick_until(engine, lambda: handle.describe()["status"] == "completed", "the run's end")
        assert handle.result(timeout=5) == "in time"
        if check is not None:
            check()
    finally:
        engine.shutdown()


@weft.activity(name="tests.lf_tick", local=True)
def lf_tick(n: int) -> int:
    time.sleep(0.0015)
    return n + 1


@weft.workflow(name="tests.lf_long_then_wait")
def lf_long_then_wait(ctx: Any) -> Any:
    yield ctx.wait_for_signal("start")
    for n in range(1000):  # exactly the cascade's rounds: its next wait is reached, not armed
        yield ctx.run(lf_tick, n)
    try:
        return (yield ctx.wait_for_signal("go", timeout="1s"))
    except weft.WaitTimeoutError:
        return "timed out"


@weft.workflow(name="tests.lf_sleeper")
def lf_sleeper(ctx: Any) -> Any:
    yield ctx.sleep("60s")


@override_settings(WEFT={"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1})
def test_a_wait_reached_at_the_end_of_a_pass_is_not_evicted_before_it_is_armed() -> None:
    """A workflow the cascade left at a frontier it has not armed yet (a wait whose timeout timer is
    not written) is not idle: evicted there, nothing would ever arm the timeout and the run would
    wait for ever (no mail recalls it)."""
    engine = Engine("lf-evict", concurrency=2)
    engine.start()
    try:
        weft.start(lf_sleeper, id="lf-evict-a-sleeper")  # resident (a timer) and over the limit with it
        handle = weft.start(lf_long_then_wait, id="lf-evict-b")
        tick_until(engine, lambda: "lf-evict-b" in engine.residency.evicted, "the parked one evicted")
        handle.signal("start")
        engine.residency.sweep(engine, db_now())  # SQLite has no wake-up: the sweep recalls it (PostgreSQL: its S:)
        tick_until(engine, lambda: handle.describe()["status"] != "running", "the run's end", timeout=30)
        assert handle.result(timeout=5) == "timed out"
    finally:
        engine.shutdown()


@weft.workflow(name="tests.lf_slow_then_end")
def lf_slow_then_end(ctx: Any) -> Any:
    first = yield ctx.run(lf_slow, 0.3)
    second = yield ctx.run(lf_slow, 0.3)
    return [first, second]


def test_a_run_ends_no_earlier_than_its_last_local_step() -> None:
    """A local step's completion is stamped when it returned (the pass time plus the time it ran);
    the run's end committed in the same pass must not be stamped before it."""
    from weft_django.models import Step, Workflow

    handle = weft.start(lf_slow_then_end, id="lf-end-order")
    Engine("lf-end-order", concurrency=1).run_until_idle(timeout=30)
    assert handle.result(timeout=5) == ["slept", "slept"]
    run = Workflow.objects.get(id="lf-end-order")
    last = max(Step.objects.filter(workflow_id="lf-end-order").values_list("completed_at", flat=True))
    assert run.finished_at is not None and run.finished_at >= last, (run.finished_at, last)
