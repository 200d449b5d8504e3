"""Local activities side by side (``ctx.all``): they run one after the other on the loop thread, and
each step is stamped when it really began and returned (a review of 3173da4)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

import weft_django as weft
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.models import Step, Timer

pytestmark = pytest.mark.django_db(transaction=True)


@weft.activity(name="tests.lp_slow", local=True)
def lp_slow(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


@weft.workflow(name="tests.lp_two_then_wait")
def lp_two_then_wait(ctx: Any) -> Any:
    yield ctx.all([ctx.run(lp_slow, 1.0), ctx.run(lp_slow, 1.0)])
    try:
        return (yield ctx.wait_for_signal("go", timeout="1s"))
    except weft.WaitTimeoutError:
        return "timed out"


def test_side_by_side_local_steps_end_one_after_the_other_and_the_next_wait_gets_its_timeout() -> None:
    """Two 1 s local steps of one frontier end 2 s after the pass began, not 1 s: the second began when
    the first returned. The wait armed after them gets its whole second (it was due as it was armed)."""
    handle = weft.start(lp_two_then_wait, id="lp-two")
    engine = Engine("lp-two", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: Timer.objects.filter(workflow_id="lp-two").exists(), "the wait's timer")
        weft.signal("lp-two", "go", "in time")  # at once: well within the wait's second
        tick_until(engine, lambda: handle.describe()["status"] == "completed", "the run's end")
        assert handle.result(timeout=5) == "in time"
        first, second = Step.objects.filter(workflow_id="lp-two", kind="activity").order_by("seq")
        assert first.completed_at is not None and second.started_at is not None and second.completed_at is not None
        assert second.started_at >= first.completed_at, (first.completed_at, second.started_at)
        assert second.completed_at - first.completed_at >= timedelta(seconds=0.9)
    finally:
        engine.shutdown()
