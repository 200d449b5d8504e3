"""An engine does not claim a backlog it cannot run while another engine may have room: once its
activity threads have as many attempts waiting as they run, and another engine is live, it acquires
no new workflow and looks again as soon as capacity frees. A single engine claims as before (a
workflow that needs no thread still starts at once). Takeovers are not bounded (tests/ownership)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import Workflow, WorkflowClaim

pytestmark = pytest.mark.django_db(transaction=True)

GATE = threading.Event()


@weft.activity
def backlog_held() -> str:
    GATE.wait(30)
    return "done"


@weft.workflow(name="tests.backlog_one_step")
def one_step(ctx: Any) -> Any:
    return (yield ctx.run(backlog_held))


@weft.workflow(name="tests.backlog_no_activity")
def no_activity(ctx: Any) -> Any:
    yield ctx.sleep("1ms")
    return "slept"


@pytest.fixture(autouse=True)
def _gate() -> Iterator[None]:
    GATE.clear()
    yield
    GATE.set()


def _held_by(engine_id: str) -> int:
    return WorkflowClaim.objects.filter(engine_id=engine_id).count()


def _ticks(engine: Engine, n: int) -> None:
    for _ in range(n):
        engine.tick()
        time.sleep(0.02)


@override_settings(WEFT={"CLAIM_BATCH_SIZE": 2, "POLL_INTERVAL": "10s"})
def test_a_saturated_engine_leaves_the_backlog_to_others_and_claims_again_when_it_frees():
    for i in range(8):
        weft.start(one_step, id=f"backlog-{i}")
    first = Engine("backlog-a", concurrency=1)
    second = Engine("backlog-b", concurrency=1)
    first.start()
    second.start()
    try:
        _ticks(first, 10)  # one batch of 2: one attempt runs, one waits -> saturated (no maintenance
        # pass for 10 s: none of its wake-up passes acquires while the other engine is live)
        assert len(first.owned) == 2 and _held_by("backlog-a") == 2
        assert first.executor.saturated
        _ticks(second, 10)  # the other engine finds the rest unclaimed
        assert _held_by("backlog-b") == 2
        assert WorkflowClaim.objects.filter(engine_id__isnull=True, workflow_id__startswith="backlog-").count() == 4
        GATE.set()  # capacity frees: both engines claim the rest at once (not at the next poll)
        deadline = time.monotonic() + 8  # well inside the 10 s POLL_INTERVAL
        while Workflow.objects.filter(pk__startswith="backlog-", status="completed").count() < 8:
            assert time.monotonic() < deadline, "the backlog did not drain"
            first.tick()
            second.tick()
            time.sleep(0.01)
    finally:
        first.shutdown()
        second.shutdown()
    assert set(Workflow.objects.filter(pk__startswith="backlog-").values_list("result", flat=True)) == {'"done"'}


@override_settings(WEFT={"CLAIM_BATCH_SIZE": 2, "POLL_INTERVAL": "50ms"})
def test_a_single_saturated_engine_still_starts_work_that_needs_no_thread():
    for i in range(4):
        weft.start(one_step, id=f"backlog-{i}")
    alone = Engine("backlog-alone", concurrency=1)
    alone.start()
    try:
        _ticks(alone, 6)
        assert alone.executor.saturated
        weft.start(no_activity, id="backlog-sleeper")
        deadline = time.monotonic() + 20
        while Workflow.objects.get(pk="backlog-sleeper").status != "completed":
            assert time.monotonic() < deadline, "a workflow without activities waited for the backlog"
            alone.tick()
            time.sleep(0.01)
    finally:
        GATE.set()
        alone.shutdown()


@override_settings(WEFT={"CLAIM_BATCH_SIZE": 2, "POLL_INTERVAL": "100ms"})
def test_with_every_engine_saturated_new_work_still_starts_at_a_maintenance_pass():
    first = Engine("backlog-a", concurrency=1)
    second = Engine("backlog-b", concurrency=1)
    first.start()
    second.start()
    try:
        for engine, ids in ((first, (0, 1)), (second, (2, 3))):  # two each: one runs, one waits
            for i in ids:
                weft.start(one_step, id=f"backlog-{i}")
            _ticks(engine, 5)
        assert first.executor.saturated and second.executor.saturated
        weft.start(no_activity, id="backlog-sleeper")
        deadline = time.monotonic() + 20
        while Workflow.objects.get(pk="backlog-sleeper").status != "completed":
            assert time.monotonic() < deadline, "new work waited for a thread to free"
            first.tick()
            second.tick()
            time.sleep(0.01)
    finally:
        GATE.set()
        first.shutdown()
        second.shutdown()
