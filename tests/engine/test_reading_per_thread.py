"""``WorkflowContext.reading`` (a query handler or an update validator runs: ``set_attributes`` and
``respond()`` are refused) describes what runs on the thread that entered it, not the context.

In an engine every context is touched by its loop thread only: queries and updates are answered between
turns on it, local activities run on it, activity threads and Celery workers get an attempt, never the
context. But ``Engine.answer_query`` is a public method of the engine ``running_engine()`` (the
``weft_engine`` fixture) yields, running on its own thread, and tests call it from theirs. A handler
run that way while the workflow's own turn ran on the engine thread made the turn read-only (its
``set_attributes`` refused: the run failed), and two handlers on two threads left the flag to whichever
finished last (a handler's writes let through, or the workflow read-only for good)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import weft_django as weft
from weft_django.context import WorkflowContext
from weft_django.exceptions import WorkflowDefinitionError
from weft_django.models import Workflow, WorkflowAttribute
from weft_django.testing import owns, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
HOLD = {"entered": threading.Event(), "release": threading.Event()}


@weft.workflow(name="tests.reading_per_thread", attributes={"stage": str})
def reading_per_thread(ctx: weft.WorkflowContext):  # type: ignore[no-untyped-def]
    def hold() -> str:
        HOLD["entered"].set()
        HOLD["release"].wait(30)
        return "held"

    ctx.on_query("hold", hold)
    yield ctx.wait_for_signal("go")
    ctx.set_attributes(stage="went")  # the workflow's own code: allowed, whatever another thread runs
    return "done"


def test_a_query_handler_on_another_thread_does_not_make_the_turn_read_only(weft_engine: Any) -> None:
    HOLD["entered"].clear()
    HOLD["release"].clear()
    handle = weft.start(reading_per_thread, id="reading-threads")
    owns(weft_engine, handle.id)
    answers: list[Any] = []
    asker = threading.Thread(target=lambda: answers.append(weft_engine.answer_query(handle.id, "hold")))
    asker.start()
    try:
        assert HOLD["entered"].wait(30), "the query handler did not start"
        handle.signal("go")  # the turn runs on the engine's thread while the handler holds this one
        wait_for(lambda: handle.status != "running", timeout=30, message="the run to end")
    finally:
        HOLD["release"].set()
        asker.join(30)
    row = Workflow.objects.get(pk=handle.id)
    assert (row.status, row.error) == ("completed", None)
    assert answers == ["held"]
    assert list(WorkflowAttribute.objects.filter(workflow_id=handle.id).values_list("str_value", flat=True)) == ["went"]


def test_overlapping_readers_on_two_threads_each_keep_their_own_mode() -> None:
    ctx = WorkflowContext(workflow_id="w", run_id="r", workflow_type="t", started_at=None, epoch=1)
    ctx.attribute_kinds = {"stage": "str"}
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[Any] = []

    def first() -> None:
        with ctx.reading("a query handler"):
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with ctx.reading("an update validator"):
            second_in.set()
            first_out.wait(10)  # the first reader left meanwhile: this one still reads
            try:
                ctx.set_attributes(stage="from the validator")
                seen.append("written")
            except WorkflowDefinitionError as exc:
                seen.append(str(exc).split(":")[0])

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert seen == ["ctx.set_attributes may not be called from an update validator"]
    assert ctx.read_only is None  # both left: nothing stays read-only on any thread
    assert ctx.pending_attributes == []
