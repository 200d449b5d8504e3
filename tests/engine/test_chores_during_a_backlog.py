"""The engine's chores (schedules, the message cleanup, the evicted-mail sweep, retention) must run while
its passes drain a backlog, not only once the engine goes idle.

A pass runs the chores when a maintenance interval is due, but stops before them while "a wake-up
arrived: serve it first". That test read the wake-up Event, which only the loop's idle wait clears: a
wake-up already served (the listener's connect, a start's NOTIFY) left it set for as long as every pass
was busy, and each skipped pass also restarted the interval that marks the chores overdue. Draining a
backlog of local-activity workflows (claims every pass, no outcome or timer to make the pass start
busy), the engine fired no schedule until the backlog was gone."""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from tests.testapp.workflows import local_steps
from weft_django.engine.engine import Engine
from weft_django.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)
BACKLOG = 2000


@override_settings(WEFT={"POLL_INTERVAL": "100ms", "CLAIM_BATCH_SIZE": 5})
def test_a_due_schedule_fires_while_the_engine_drains_a_backlog() -> None:
    weft.start_many([weft.StartRequest(local_steps, args=[f"bk-{n}", 1], id=f"bk-{n}") for n in range(BACKLOG)])
    weft.schedule("tests.scheduled_run", id="during", every="1s")  # due 1 s from now: in the drain
    engine = Engine("chores", concurrency=2)
    engine.start()
    left_when_fired = None
    try:
        for _ in range(20 * BACKLOG):  # the loop as Engine.run drives it: wait only after an idle pass
            if not engine.tick():
                engine._wait(0.01)
            if Workflow.objects.filter(schedule_id="during").exists():
                left_when_fired = Workflow.objects.filter(id__startswith="bk-").exclude(status="completed").count()
                break
    finally:
        engine.shutdown()
    assert left_when_fired is not None, "the schedule never fired"
    assert left_when_fired > 0, "the schedule fired only once the backlog was drained"
