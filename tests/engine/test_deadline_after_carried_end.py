"""A run whose end (or continuation) was decided in a pass whose commit was carried (its claim row
held by another transaction, ADR 0003) keeps that end when its execution deadline passes before the
carried commit lands: the deadline's timer must not replace an end the run already reached (found by
a helper's review, rev2). PostgreSQL: row locks."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import ContinuedRun, Workflow, WorkflowClaim

from .test_commit_locks import holding
from .ticking import tick_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")


@weft.workflow(name="tests.rv2_deadline_end")
def deadline_end(ctx: Any) -> Any:
    value = yield ctx.wait_for_signal("go")
    return f"got {value}"


@weft.workflow(name="tests.rv2_deadline_chain")
def deadline_chain(ctx: Any, round: int) -> Any:
    if round == 0:
        yield ctx.wait_for_signal("go")
        yield ctx.continue_as_new(1)
    yield ctx.wait_for_signal("never")


def _carried_past_deadline(engine: Engine, handle: Any, weft_clock: Any) -> None:
    """Park the run, hold its claim row, deliver "go" (its end is decided and carried), then move
    workflow time past its execution deadline and let the row go."""
    tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].signal_top is not None, "parked")
    claims = WorkflowClaim._meta.db_table
    with holding(f"SELECT 1 FROM {claims} WHERE workflow_id = %s FOR UPDATE", [handle.id]):
        handle.signal("go", "it")
        tick_until(engine, lambda: handle.id in engine._carried, "the end carried (claim row held)")
        weft_clock.advance(3600)
        time.sleep(0.6)  # past the pass clock's reuse: the next pass reads the moved clock
    tick_until(engine, lambda: handle.id not in engine._carried, "the carried commit landed")


def test_a_run_that_completed_in_a_carried_commit_is_not_timed_out(weft_clock):
    handle = weft.start(deadline_end, id="rv2-deadline-end", execution_timeout="60s")
    engine = Engine("rv2-deadline", concurrency=2)
    engine.start()
    try:
        _carried_past_deadline(engine, handle, weft_clock)
        tick_until(engine, lambda: handle.status != "running", "its end")
    finally:
        engine.shutdown()
    row = Workflow.objects.get(pk=handle.id)
    assert (row.status, row.result) == ("completed", '"got it"'), (row.status, row.error)


def test_a_run_that_continued_in_a_carried_commit_is_not_also_ended(weft_clock):
    handle = weft.start(deadline_chain, args=[0], id="rv2-deadline-chain", execution_timeout="60s")
    engine = Engine("rv2-deadline", concurrency=2)
    engine.start()
    try:
        first_run = str(Workflow.objects.get(pk=handle.id).run_id)
        _carried_past_deadline(engine, handle, weft_clock)
        ended = time.monotonic() + 10
        while handle.status == "running" and time.monotonic() < ended:
            engine.tick()
            time.sleep(0.01)
    finally:
        engine.shutdown()
    row = Workflow.objects.get(pk=handle.id)
    claim = WorkflowClaim.objects.get(pk=handle.id)
    # Before the fix the carried commit both timed the first run out and continued it: the next run
    # was left running with a claim no engine acquires (runnable=False), for ever.
    assert row.status != "running" or claim.runnable, "the next run is running, but no engine can ever claim it"
    continued = list(ContinuedRun.objects.filter(workflow_id=handle.id).values_list("run_id", flat=True))
    # The chain's deadline is the chain's: the next run times out, once; the first run ended by continuing.
    assert row.status == "timed_out"
    assert [str(run) for run in continued] == [first_run]
    assert str(row.run_id) != first_run
