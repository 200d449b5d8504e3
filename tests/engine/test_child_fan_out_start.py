"""A parent starting many children in one pass writes them together, not one at a time.

The children a pass asks for are started inside the parent's fenced commit, on the engine loop's
thread. Before the fix each child took its own savepoint, row, epoch and claim (five statements): a
ctx.all of 8,000 children held the loop 41.7 s in the start alone. Now they are written in a few
statements whatever their number, and a taken id still fails only its own child (the savepoint of the
batch rolls back and each is written alone, as before). The statements are counted, not timed.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import Workflow, WorkflowClaim

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)

FAN_OUT = 200


@weft.workflow(name="tests.child_fan_out_leaf")
def leaf(ctx: Any, i: int) -> Any:
    return i
    yield  # a generator: a workflow


@weft.workflow(name="tests.child_fan_out_parent")
def parent(ctx: Any, n: int, prefix: str) -> Any:
    results = yield ctx.all([ctx.start_child(leaf, args=[i], id=f"{prefix}-{i}") for i in range(n)])
    return sum(results)


def _child_inserts(queries: CaptureQueriesContext) -> int:
    return sum(1 for query in queries.captured_queries if query["sql"].startswith('INSERT INTO "weft_django_workflow"'))


def test_a_parents_children_are_written_together() -> None:
    handle = weft.start(parent, args=[FAN_OUT, "cfo"], id="cfo-parent")
    engine = Engine("child-fan-out", concurrency=4)
    engine.start()
    try:
        with CaptureQueriesContext(connection) as queries:
            tick_until(engine, lambda: Workflow.objects.filter(parent_id=handle.id).count() == FAN_OUT, "children")
        inserts = _child_inserts(queries)
        # One statement (PostgreSQL), or one per batch of SQLite's parameter limit (7 here): not one per child.
        assert inserts <= FAN_OUT // 20, f"{inserts} statements inserted {FAN_OUT} children's rows"
        epochs = sorted(WorkflowClaim.objects.filter(workflow_id__startswith="cfo-").values_list("epoch", flat=True))
        assert len(set(epochs)) == FAN_OUT + 1, "each child's claim has an epoch of its own"
        tick_until(engine, lambda: handle.describe()["status"] == "completed", "the parent's end", timeout=120)
        assert handle.result(timeout=1) == sum(range(FAN_OUT))
    finally:
        engine.shutdown()


def test_a_taken_id_in_a_fan_out_fails_only_its_own_child() -> None:
    weft.start(leaf, args=[-1], id="cft-3")  # a workflow of its own holds one child's id
    handle = weft.start(parent, args=[6, "cft"], id="cft-parent")
    engine = Engine("child-fan-out-taken", concurrency=4)
    engine.start()
    try:
        tick_until(engine, lambda: handle.describe()["status"] in ("completed", "failed"), "the parent's end")
        assert handle.describe()["status"] == "failed"
        with pytest.raises(weft.WorkflowFailedError, match="cft-3"):
            handle.result(timeout=1)
        started = set(Workflow.objects.filter(parent_id=handle.id).values_list("id", flat=True))
        assert started == {f"cft-{i}" for i in range(6) if i != 3}, started
        assert Workflow.objects.get(id="cft-3").parent_id is None  # the other workflow's row is untouched
    finally:
        engine.shutdown()


def test_children_written_together_are_cut_into_statements_postgresql_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each child's input may be PAYLOAD_MAX_BYTES: together they are cut by rows and by bytes, as
    start_many's are (store/runs_bulk.py), or one statement could pass PostgreSQL's 1 GB message limit."""
    from weft_django.store import runs_bulk

    monkeypatch.setattr(runs_bulk, "CHUNK_ROWS", 7)
    handle = weft.start(parent, args=[30, "cfc"], id="cfc-parent")
    engine = Engine("child-fan-out-chunks", concurrency=4)
    engine.start()
    try:
        with CaptureQueriesContext(connection) as queries:
            tick_until(engine, lambda: Workflow.objects.filter(parent_id=handle.id).count() == 30, "children")
        assert _child_inserts(queries) >= 5  # 30 rows, 7 per statement
        tick_until(engine, lambda: handle.describe()["status"] == "completed", "the parent's end", timeout=60)
        assert handle.result(timeout=1) == sum(range(30))
        epochs = WorkflowClaim.objects.filter(workflow_id__startswith="cfc-").values_list("epoch", flat=True)
        assert len(set(epochs)) == 31
    finally:
        engine.shutdown()
