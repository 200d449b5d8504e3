"""An engine's timer heap keeps the entries of timers it disarmed (a signal that came before its
wait's timeout, a run that continued as new) and skips them lazily when they come due. A stale entry
must not fire the timer another context of the same workflow id holds at the same (kind, seq): the
next run of a continue_as_new chain numbers its steps from 0 again (found by a helper's review, rev2)."""

from __future__ import annotations

import time
from typing import Any

import pytest

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import Workflow

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.rv2_timeout_chain")
def timeout_chain(ctx: Any, round: int) -> Any:
    if round == 0:
        yield ctx.wait_for_signal("go", timeout="1h")  # the signal comes first: this timer is disarmed
        yield ctx.continue_as_new(1)
    try:
        yield ctx.wait_for_signal("go", timeout="10h")  # the same (kind, seq) as the first run's wait
    except weft.WaitTimeoutError:
        return "timed out"
    return "signalled"


def _parked(engine: Engine, workflow_id: str, run_id: str | None = None) -> bool:
    owned = engine.owned.get(workflow_id)
    if owned is None or (run_id is not None and owned.run_id == run_id):
        return False
    return bool(owned.timers)


def _two_hours_later(engine: Engine, weft_clock: Any) -> None:
    """Move workflow time 2 h on and let the engine run a few passes."""
    weft_clock.advance(2 * 3600)
    time.sleep(0.6)  # past the pass clock's reuse
    for _ in range(20):
        engine.tick()
        time.sleep(0.02)


def test_a_stale_timer_of_the_previous_run_does_not_end_the_next_runs_wait(weft_clock):
    handle = weft.start(timeout_chain, args=[0], id="rv2-timeout-chain")
    engine = Engine("rv2-timers", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: _parked(engine, handle.id), "the first run parked on its wait")
        first_run = engine.owned[handle.id].run_id
        handle.signal("go", 1)
        tick_until(engine, lambda: _parked(engine, handle.id, first_run), "the next run parked on its wait")
        _two_hours_later(engine, weft_clock)  # past the first run's 1 h timeout, far before the next run's 10 h
    finally:
        engine.shutdown()
    row = Workflow.objects.get(pk=handle.id)
    assert str(row.run_id) != first_run
    assert row.status == "running", f"the next run's 10 h wait ended after 2 h ({row.status}: {row.result})"


@weft.workflow(name="tests.rv2_deadline_reused_id")
def deadline_reused_id(ctx: Any) -> Any:
    return (yield ctx.wait_for_signal("go"))


def test_the_deadline_of_an_earlier_run_under_the_same_id_does_not_time_out_the_new_one(weft_clock):
    first = weft.start(deadline_reused_id, id="rv2-reused", execution_timeout="1h")
    engine = Engine("rv2-timers", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: first.id in engine.owned, "the first run held")
        first.signal("go", "first")
        tick_until(engine, lambda: first.status == "completed", "the first run's end")
        weft.start(deadline_reused_id, id="rv2-reused", execution_timeout="10h", on_conflict="start_new")
        tick_until(engine, lambda: first.id in engine.owned, "the new run held by the same engine")
        _two_hours_later(engine, weft_clock)  # past the first run's deadline, far before the new run's
    finally:
        engine.shutdown()
    row = Workflow.objects.get(pk="rv2-reused")
    assert row.status == "running", f"the new run (10 h) ended after 2 h: {row.status} {row.error}"
