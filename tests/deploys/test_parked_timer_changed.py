"""A run parked on a wait that armed a durable timer (a sleep, a signal or wait_until timeout) has
that operation on record at its position: the timer. Code deployed in place that yields another
operation there diverges from the run, as it would from a step. Before this was checked, the engine
armed the new operation at the sleep's position, and the old sleep's timer, firing later, settled it
as a sleep: an activity's yield returned None while the activity still ran. The replay check passed
the change (found by a helper's review, rev6)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import weft_django as weft
from tests.testapp.models import ActivityCall
from tests.testapp.workflows import slow_step
from weft_django import history_file
from weft_django.engine.engine import Engine
from weft_django.engine.replayer import replay
from weft_django.models import Timer, Workflow
from weft_django.registry import WorkflowDefinition, registry
from weft_django.store import replay as stored
from weft_django.testing import run_until_idle

from ..engine.ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)
SLEEPY = "tests.deploys.sleepy"


@weft.workflow(name=SLEEPY)
def sleepy(ctx: Any) -> Any:
    yield ctx.sleep("60s")
    return "slept"


def sleepy_changed(ctx: Any) -> Any:  # an activity inserted before the sleep, with no ctx.patched
    prepared = yield ctx.run(slow_step, "prepare", 1.0)
    yield ctx.sleep("60s")
    return prepared


def _stored(workflow_id: str) -> Any:
    with stored.read_only("default"):
        return next(h for h in stored.page("default", after=None, size=10) if h.workflow_id == workflow_id)


def test_code_that_yields_another_operation_where_a_timer_waits_is_refused(monkeypatch, weft_clock):
    handle = weft.start(SLEEPY, id="sleepy-1")
    run_until_idle()
    assert Timer.objects.filter(workflow_id=handle.id, kind="sleep", seq=0).exists()  # parked on its sleep
    monkeypatch.setitem(registry.workflows, (SLEEPY, "1"), WorkflowDefinition(sleepy_changed, SLEEPY, "1"))

    history = _stored(handle.id)
    outcome = replay(history)  # the deploy check, and the same history through `weft export`
    assert not outcome.ok and outcome.error_type == "NonDeterminismError", outcome
    assert "sleep timer armed there" in outcome.message
    assert not replay(history_file.load(json.dumps(history_file.to_json(history)))).ok

    engine = Engine("rv6-timer", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned or Workflow.objects.get(pk=handle.id).stuck_error, "load")
        weft_clock.advance(61)  # the old sleep comes due while whatever the new code armed runs
        for _ in range(100):
            engine.tick()
            if Workflow.objects.get(pk=handle.id).status != "running":
                break
    finally:
        engine.shutdown()
    row = Workflow.objects.get(pk=handle.id)
    assert (row.status, row.result) == ("running", None), (row.status, row.result)
    assert row.stuck_error is not None and row.stuck_error["type"] == "NonDeterminismError", row.stuck_error
    assert not ActivityCall.objects.filter(name="slow_step", key="prepare").exists()  # nothing of the new code ran
