"""Retrying a parent that failed because its child failed (the child's ChildWorkflowError was not
caught). The retry removes the failing child step, so the parent starts the child again under the same
id: that id is its own child's, not a foreign workflow's. Before the fix (found by a helper's review,
session 17) the start's "already exists" report collided with the consumed record of the child's first
end (one record per step and run) and was dropped: the parent waited for ever."""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)
KID_FAILS = {"on": True}


@weft.workflow(name="tests.retry_kid")
def retry_kid(ctx):
    yield ctx.sleep("1ms")
    if KID_FAILS["on"]:
        raise RuntimeError("the kid failed")
    return "kid ok"


@weft.workflow(name="tests.retry_parent")
def retry_parent(ctx):
    got = yield ctx.start_child(retry_kid, id=f"{ctx.workflow_id}-kid")
    return f"parent got {got}"


def test_retrying_the_parent_alone_ends_it_again_with_the_childs_failure(weft_run_until_idle, weft_clock):
    KID_FAILS["on"] = True
    parent = weft.start(retry_parent, id="rp-1")
    weft_run_until_idle()
    assert parent.status == "failed" and weft.get_handle("rp-1-kid").status == "failed"
    parent.retry()
    weft_run_until_idle()
    row = Workflow.objects.get(pk="rp-1")
    assert row.status == "failed", "the retried parent waits for ever for a child that already ended"
    assert "the kid failed" in str(row.error)


def test_retrying_the_child_then_the_parent_completes_both(weft_run_until_idle, weft_clock):
    KID_FAILS["on"] = True
    parent = weft.start(retry_parent, id="rp-2")
    weft_run_until_idle()
    assert parent.status == "failed"
    KID_FAILS["on"] = False
    kid = weft.get_handle("rp-2-kid")
    kid.retry()
    weft_run_until_idle()
    assert kid.status == "completed"
    parent.retry()
    weft_run_until_idle()
    assert parent.result(timeout=5) == "parent got kid ok"
