"""WEFT["CLAIM_AHEAD"] (engine/ahead.py) under interleavings forced by a review (session 26's
``aheadreview`` helper), each seen failing before its fix:

- the pass after a claim ahead still acquires what a wake-up names (the claim ahead stands for the
  next pass's full-batch rescan only), not a POLL_INTERVAL later.
"""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

import weft_django as weft
from tests.engine.test_claim_ahead import AHEAD, BATCH, _drain, _each_step_once, _engine, _start_backlog
from tests.testapp.workflows import local_steps
from weft_django.models import Workflow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@override_settings(WEFT=AHEAD)
def test_the_pass_after_a_claim_ahead_acquires_what_a_wake_up_names() -> None:
    """A claim ahead took the backlog's last, partial batch. A run started then sends its wake-up:
    the next pass acquires it at once, not a POLL_INTERVAL (10 s here) later."""
    ids = _start_backlog("car-wake", BATCH + 2)  # a full batch, then two: the claim ahead's is partial
    engine = _engine("car-wake")
    try:
        for _ in range(20):
            engine.tick()
            if engine.claimed_ahead:
                break
        assert engine.claimed_ahead == 2, "the commit of the first batch ran no claim ahead"
        late = weft.start(local_steps, args=["car-wake-late", 1], id="car-wake-late").id
        deadline = time.monotonic() + 5
        while not engine.wake.pending(late) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.wake.pending(late), "the start's wake-up never arrived"
        began = time.monotonic()
        _drain(engine, [*ids, late], passes=100)
        assert time.monotonic() - began < 5, "the woken run waited for the maintenance scan"
    finally:
        engine.shutdown()
    _each_step_once(ids, 3)
    assert Workflow.objects.get(pk=late).status == "completed"
