"""A run whose execution deadline fires in the same pass as an outcome that moved its code on: the
new frontier belongs to a run that has just timed out. Nothing of it may be armed: no local activity
run, no child started (a review of 00a3fa7/8f44836)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import Workflow

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)
GATE = {"started": threading.Event(), "release": threading.Event()}
RAN: list[str] = []


@weft.activity(name="tests.dn_gated")
def gated() -> str:
    GATE["started"].set()
    GATE["release"].wait(20)
    return "done"


@weft.activity(name="tests.dn_local_effect", local=True)
def local_effect() -> str:
    RAN.append("local")
    return "effect"


@weft.workflow(name="tests.dn_child")
def dn_child(ctx: Any) -> Any:
    return (yield ctx.wait_for_signal("never"))


@weft.workflow(name="tests.dn_then_local")
def then_local(ctx: Any) -> Any:
    yield ctx.run(gated)
    return (yield ctx.run(local_effect))


@weft.workflow(name="tests.dn_then_child")
def then_child(ctx: Any) -> Any:
    yield ctx.run(gated)
    return (yield ctx.start_child(dn_child, id="dn-the-child"))


def _outcome_and_deadline_in_one_pass(engine: Engine, clock: Any) -> None:
    """The attempt running; then the deadline passed and the attempt returned, both before one pass."""
    tick_until(engine, GATE["started"].is_set, "the attempt running")
    clock.advance(2 * 3600)  # the 1 h deadline is due
    GATE["release"].set()
    deadline = time.monotonic() + 10
    while engine.executor.outcomes.empty():
        assert time.monotonic() < deadline, "the attempt never returned"
        time.sleep(0.01)
    engine.tick()  # the outcome settles the step, and the deadline fires, in this one pass


@pytest.fixture(autouse=True)
def _reset() -> None:
    GATE["started"].clear()
    GATE["release"].clear()
    RAN.clear()


def _timed_out_in_one_pass(workflow: Any, workflow_id: str, weft_clock: Any) -> None:
    """Start ``workflow`` with a 1 h deadline; its activity's outcome and the deadline land in one pass."""
    handle = weft.start(workflow, id=workflow_id, execution_timeout="1h")
    engine = Engine(workflow_id, concurrency=2)
    engine.start()
    try:
        _outcome_and_deadline_in_one_pass(engine, weft_clock)
        tick_until(engine, lambda: handle.status == "timed_out", "the run timed out")
    finally:
        engine.shutdown()
    assert Workflow.objects.get(pk=workflow_id).status == "timed_out"


def test_a_run_timed_out_in_the_pass_does_not_run_its_next_local_activity(weft_clock):
    _timed_out_in_one_pass(then_local, "dn-local", weft_clock)
    assert RAN == [], "the local activity ran for a run that had already timed out"


def test_a_run_timed_out_in_the_pass_does_not_start_its_next_child(weft_clock):
    _timed_out_in_one_pass(then_child, "dn-parent", weft_clock)
    child = Workflow.objects.filter(pk="dn-the-child").values_list("status", flat=True).first()
    assert child is None, f"a child was started by a run that had already timed out (it is {child})"
