"""The children that end in one fenced commit tell their parents in a few statements, not two each.

A child's end is written into its parent's mailbox (a buffered record under the step's reserved name)
and wakes the parent's engine, inside the child's fenced commit. Before, each child that ended took
an insert and a NOTIFY statement of its own: a batch commit of 200 children that ended together ran
400 statements for it on the engine loop's thread. Now the batch's ends are one insert (per chunk of
what the database binds) and one wake-up statement. The statements are counted, not timed.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import BufferedSignal
from weft_django.status import SignalState

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)

FAN_OUT = 120


@weft.workflow(name="tests.child_ends_leaf")
def leaf(ctx: Any, i: int) -> Any:
    return i
    yield  # a generator: a workflow


@weft.workflow(name="tests.child_ends_failing_leaf")
def failing_leaf(ctx: Any, i: int) -> Any:
    raise ValueError(f"child {i} failed")
    yield  # a generator: a workflow


@weft.workflow(name="tests.child_ends_parent")
def parent(ctx: Any, n: int, prefix: str) -> Any:
    results = yield ctx.all([ctx.start_child(leaf, args=[i], id=f"{prefix}-{i}") for i in range(n)])
    return sum(results)


@weft.workflow(name="tests.child_ends_two_parents")
def mixed_parent(ctx: Any, prefix: str) -> Any:
    ok = yield ctx.start_child(leaf, args=[7], id=f"{prefix}-ok")
    try:
        yield ctx.start_child(failing_leaf, args=[8], id=f"{prefix}-bad")
    except weft.ChildWorkflowError as exc:
        return [ok, "failed", str(exc)]
    return [ok, "no failure"]


def _end_inserts(queries: CaptureQueriesContext) -> int:
    return sum(
        1 for query in queries.captured_queries if query["sql"].startswith('INSERT INTO "weft_django_bufferedsignal"')
    )


def test_children_that_end_together_tell_their_parent_in_a_few_statements() -> None:
    handle = weft.start(parent, args=[FAN_OUT, "cet"], id="cet-parent")
    engine = Engine("child-ends-together", concurrency=4)
    engine.start()
    try:
        with CaptureQueriesContext(connection) as queries:
            tick_until(engine, lambda: handle.describe()["status"] == "completed", "the parent's end", timeout=120)
        assert handle.result(timeout=1) == sum(range(FAN_OUT))
        records = BufferedSignal.objects.filter(workflow_id=handle.id)
        assert records.count() == FAN_OUT and not records.exclude(state=SignalState.CONSUMED).exists()
        inserts = _end_inserts(queries)
        assert inserts <= FAN_OUT // 10, f"{inserts} statements wrote the ends of {FAN_OUT} children"
    finally:
        engine.shutdown()


def test_a_failed_and_a_completed_child_each_reach_their_step() -> None:
    handle = weft.start(mixed_parent, args=["cem"], id="cem-parent")
    engine = Engine("child-ends-mixed", concurrency=4)
    engine.start()
    try:
        tick_until(engine, lambda: handle.describe()["status"] == "completed", "the parent's end", timeout=60)
        ok, state, message = handle.result(timeout=1)
        assert (ok, state) == (7, "failed") and "child 8 failed" in message
    finally:
        engine.shutdown()
