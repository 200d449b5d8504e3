"""Child workflows go through their queue like any other start (PostgreSQL and SQLite): a child of a
workflow declared with ``@weft.workflow(queue=)``, or started with ``ctx.start_child(..., queue=)``,
is pending in that queue until an engine admits it, so the queue's limits hold for a fan-out.
(Before, every child started running at once, outside any queue.)"""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.exceptions import UnknownQueueError
from weft_django.models import Workflow, WorkflowClaim
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

WEFT = {"QUEUES": {"tests-default": {"concurrency": 1}}, "POLL_INTERVAL": "50ms"}


def _children(parent: str) -> list[dict]:
    return list(Workflow.objects.filter(parent_id=parent).order_by("id").values("status", "queue", "admitted_at"))


def _most_at_once() -> int:
    running = most = 0
    for name in (
        ActivityCall.objects.filter(name__in=["q-start", "q-end"]).order_by("id").values_list("name", flat=True)
    ):
        running += 1 if name == "q-start" else -1
        most = max(most, running)
    return most


@override_settings(WEFT=WEFT)
def test_children_of_a_queued_workflow_wait_in_its_queue():
    handle = weft.start("tests.queued_parent", args=["tests.queued_default", 3], id="qp-default")
    run_until_idle(timeout=60)
    assert handle.result(timeout=5) == 3
    children = _children("qp-default")
    assert [(c["status"], c["queue"], c["admitted_at"] is not None) for c in children] == [
        ("completed", "tests-default", True)
    ] * 3
    assert _most_at_once() == 1  # the queue's concurrency 1 held across the fan-out


@override_settings(WEFT=WEFT)
def test_start_child_with_queue_puts_the_child_in_that_queue_and_out_of_the_acquire_index():
    from weft_django.engine.engine import Engine

    weft.start("tests.queued_parent", args=["tests.queued", 2, "tests-default"], id="qp-given")
    engine = Engine("qp-engine")
    for _ in range(3):  # the parent's first passes: its commit starts the children
        engine.tick(claim=True)
        if Workflow.objects.filter(parent_id="qp-given").exists():
            break
    waiting = Workflow.objects.filter(parent_id="qp-given", status="pending").values_list("pk", flat=True)
    runnable = dict(WorkflowClaim.objects.filter(workflow_id__in=list(waiting)).values_list("workflow_id", "runnable"))
    assert all(flag is False for flag in runnable.values())
    engine.shutdown()
    run_until_idle(timeout=60)
    assert [c["queue"] for c in _children("qp-given")] == ["tests-default"] * 2
    assert weft.get_handle("qp-given").result(timeout=5) == 2


@override_settings(WEFT=WEFT)
def test_start_child_with_an_unknown_queue_fails_the_parent_and_starts_nothing():
    handle = weft.start("tests.queued_parent", args=["tests.queued", 1, "no-such-queue"], id="qp-bad")
    run_until_idle(timeout=30)
    row = Workflow.objects.get(pk="qp-bad")
    assert row.status == "failed"
    assert row.error["type"] == UnknownQueueError.__name__
    assert "no-such-queue" in row.error["message"]
    assert not Workflow.objects.filter(parent_id="qp-bad").exists()
    with pytest.raises(weft.WorkflowFailedError):
        handle.result(timeout=5)
