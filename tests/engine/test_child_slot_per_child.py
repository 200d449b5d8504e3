"""A parent step's child-terminal slot is per child, not per (run, step). A parent retried whose code
now gives the step another child id starts that new child; the old child, retried too, still reports
its end under the same step. Before the fix the old child's record took the one slot of (run, step)
(and was consumed out of the way, as another child's end), so the new child's end could never be
written (a conflicting signal id, ignored): the parent waited for ever."""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django.models import BufferedSignal, Workflow

pytestmark = pytest.mark.django_db(transaction=True)
KID = {"id": "slot-k1", "fails": True}


@weft.workflow(name="tests.slot_kid")
def slot_kid(ctx):
    if ctx.workflow_id.endswith("k2"):
        yield ctx.wait_for_signal("go")
        return "k2 ok"
    yield ctx.sleep("1ms")
    if KID["fails"]:
        raise RuntimeError("k1 failed")
    return "k1 ok"


@weft.workflow(name="tests.slot_parent")
def slot_parent(ctx):
    got = yield ctx.start_child(slot_kid, id=KID["id"])
    return f"parent got {got}"


def test_a_new_childs_end_reaches_a_step_an_old_child_reported_to(weft_run_until_idle, weft_clock):
    KID.update(id="slot-k1", fails=True)
    parent = weft.start(slot_parent, id="slot-p")
    weft_run_until_idle()
    assert parent.status == "failed" and weft.get_handle("slot-k1").status == "failed"
    KID.update(id="slot-k2", fails=False)  # a deploy gives the step another child
    parent.retry()
    weft_run_until_idle()
    assert weft.get_handle("slot-k2").status == "running"
    weft.get_handle("slot-k1").retry()  # the old child runs again and reports to the same step
    weft_run_until_idle()
    assert weft.get_handle("slot-k1").status == "completed"
    weft.get_handle("slot-k2").signal("go")
    weft_run_until_idle()
    assert weft.get_handle("slot-k2").status == "completed"
    records = list(BufferedSignal.objects.filter(workflow_id="slot-p").values_list("signal_id", "state"))
    row = Workflow.objects.get(pk="slot-p")
    assert row.status == "completed", f"the parent waits for ever for its new child ({row.status}; {records})"
    assert parent.result(timeout=5) == "parent got k2 ok"
