"""Issue 21 item 6: after a takeover (or any reload) a wait's step records when the wait really
began, not when the new owner loaded the run. On 2ae2264 the admin's timeline showed a 60 s sleep
taken over 8 s before it fired as an 8.2 s bar (and a 45 s one as 12 ms); the timer fired on time."""

from __future__ import annotations

from datetime import timedelta

import pytest

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import Step, Timer

pytestmark = pytest.mark.django_db(transaction=True)
ADMIN = "/admin/weft_django"


def _first_pass(workflow_id: str, engine_id: str) -> None:
    """Run an engine until the workflow is parked at its wait, then stop it (its claim is released)."""
    engine = Engine(engine_id)
    engine.start()
    try:
        for _ in range(20):
            engine.tick()
            owned = engine.owned.get(workflow_id)
            if owned is not None and owned.armed:
                break
        assert engine.owned[workflow_id].armed, "the workflow did not reach its wait"
        engine.tick()  # the pass that commits its timer, if any
    finally:
        engine.shutdown()


def test_a_sleep_taken_over_before_it_fires_keeps_its_real_start(admin_client, weft_clock, weft_run_until_idle):
    handle = weft.start("tests.sleeper", args=[60], id="r21-sleep-takeover")
    _first_pass(handle.id, "r21-first-owner")
    timer = Timer.objects.get(workflow_id=handle.id)
    began = timer.fire_at - timedelta(seconds=60)
    weft_clock.advance(52)  # the first owner is gone; another engine loads the run 8 s before it fires
    weft_run_until_idle()
    assert handle.status == "running"
    weft_clock.advance(9)
    weft_run_until_idle()
    assert handle.status == "completed"
    step = Step.objects.get(workflow_id=handle.id, seq=0)
    assert abs(step.started_at - began) < timedelta(milliseconds=5), (step.started_at, began)
    assert step.completed_at - step.started_at >= timedelta(seconds=60)
    bars = admin_client.get(f"{ADMIN}/workflow/{handle.id}/change/").context["timeline"].bars
    assert [bar.kind for bar in bars] == ["sleep"] and bars[0].duration.startswith("1 m"), bars
    assert not bars[0].inferred_start


def test_a_signal_wait_taken_over_keeps_its_real_start(weft_clock, weft_run_until_idle):
    handle = weft.start("tests.signals", id="r21-signal-takeover")
    _first_pass(handle.id, "r21-first-owner")
    weft_clock.advance(45)
    weft_run_until_idle()  # a new owner loads the run, parked at the same wait
    weft.signal(handle.id, "go", 1)
    weft_run_until_idle()
    step = Step.objects.filter(workflow_id=handle.id, kind="signal").order_by("seq").first()
    assert step is not None
    assert step.completed_at - step.started_at >= timedelta(seconds=45), (step.started_at, step.completed_at)


def test_a_first_sleep_armed_late_spans_its_own_duration(weft_clock, weft_run_until_idle):
    """A run whose first sleep is armed long after its start (no engine ran meanwhile): the sleep's
    step spans the sleep, from when its timer was armed, not from the run's start."""
    handle = weft.start("tests.sleeper", args=[30], id="r21-late-first-sleep")
    weft_clock.advance(120)  # no engine for two minutes
    weft_run_until_idle()
    weft_clock.advance(31)
    weft_run_until_idle()
    step = Step.objects.get(workflow_id=handle.id, seq=0)
    assert timedelta(seconds=30) <= step.completed_at - step.started_at < timedelta(seconds=60)
