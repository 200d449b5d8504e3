"""Retrying a parent that failed on its child's failure, under code that now starts another workflow
at that step. The retry removes the failing child step and the parent starts a child again under the
same (default) id, which its old child holds. That old child is the parent's own only if it runs the
workflow asked for: a child of another workflow type is not the child this code started, and its end
must not settle the step (the parent would take an ``old`` run's result as the ``new`` one's). The
step fails as for any taken id (WorkflowAlreadyExistsError), as concepts.md says."""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)
CODE = {"kid": "old", "old_fails": True}


@weft.workflow(name="tests.retype_old_kid")
def retype_old_kid(ctx):
    yield ctx.sleep("1ms")
    if CODE["old_fails"]:
        raise RuntimeError("the old kid failed")
    return "old kid ok"


@weft.workflow(name="tests.retype_new_kid")
def retype_new_kid(ctx):
    yield ctx.sleep("1ms")
    return "new kid ok"


@weft.workflow(name="tests.retype_parent")
def retype_parent(ctx):
    kid = retype_old_kid if CODE["kid"] == "old" else retype_new_kid
    got = yield ctx.start_child(kid)  # the default id: <parent id>/0 under either code
    return f"parent got {got}"


def test_a_retried_parent_does_not_take_the_end_of_an_old_child_of_another_workflow(weft_run_until_idle, weft_clock):
    CODE.update(kid="old", old_fails=True)
    parent = weft.start(retype_parent, id="retype-p")
    weft_run_until_idle()
    assert parent.status == "failed" and weft.get_handle("retype-p/0").status == "failed"
    CODE["old_fails"] = False  # the old child is retried first and completes ...
    weft.get_handle("retype-p/0").retry()
    weft_run_until_idle()
    assert weft.get_handle("retype-p/0").status == "completed"
    CODE["kid"] = "new"  # ... then a deploy makes the parent start another workflow at that step
    parent.retry()
    weft_run_until_idle()
    row = Workflow.objects.get(pk="retype-p")
    assert (row.status, row.result) == ("failed", None), f"the parent took the old child's end: {row.result}"
    assert row.error["type"] == "ChildWorkflowError"
    assert "already exists" in row.error["message"], row.error
    assert Workflow.objects.get(pk="retype-p/0").workflow_type == "tests.retype_old_kid"  # left as it was


def test_a_retried_parent_still_takes_the_end_of_its_own_child(weft_run_until_idle, weft_clock):
    CODE.update(kid="old", old_fails=True)
    parent = weft.start(retype_parent, id="retype-own")
    weft_run_until_idle()
    assert parent.status == "failed"
    CODE["old_fails"] = False
    weft.get_handle("retype-own/0").retry()
    weft_run_until_idle()
    parent.retry()  # the same code: the same child
    weft_run_until_idle()
    assert parent.result(timeout=5) == "parent got old kid ok"
