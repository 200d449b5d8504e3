"""A run that passes its execution deadline ends timed_out, and its activity attempts still running on
the engine's threads are asked to stop (``weft.heartbeat()`` raises ActivityCancelledError), as when
the run ends any other way or is cancelled (found by a helper's review, rev2)."""

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
SEEN = {"started": threading.Event(), "stopped": threading.Event()}


@weft.activity(name="tests.rv2_heartbeats")
def heartbeats() -> str:
    SEEN["started"].set()
    ends = time.monotonic() + 20
    while time.monotonic() < ends:
        try:
            weft.heartbeat()
        except weft.ActivityCancelledError:
            SEEN["stopped"].set()
            raise
        time.sleep(0.02)
    return "ran to its end"


@weft.workflow(name="tests.rv2_deadline_attempt")
def deadline_attempt(ctx: Any) -> Any:
    return (yield ctx.run(heartbeats))


def test_the_attempts_of_a_run_past_its_deadline_are_asked_to_stop(weft_clock):
    SEEN["started"].clear()
    SEEN["stopped"].clear()
    handle = weft.start(deadline_attempt, id="rv2-deadline-attempt", execution_timeout="1h")
    engine = Engine("rv2-deadline-attempt", concurrency=2)
    engine.start()
    try:
        tick_until(engine, SEEN["started"].is_set, "the attempt running")
        weft_clock.advance(2 * 3600)
        time.sleep(0.6)  # past the pass clock's reuse
        tick_until(engine, lambda: handle.status == "timed_out", "the run timed out")
        asked = SEEN["stopped"].wait(5)
    finally:
        engine.shutdown()
    assert Workflow.objects.get(pk=handle.id).status == "timed_out"
    assert asked, "the attempt of the timed-out run was never asked to stop: it ran on for its 20 s"
