"""A child's end reaches its parent as a buffered signal under a reserved name
(``__weft_child__:<seq>``, store/mailbox.py). A caller's signal under that name (``weft.signal``,
``start_or_signal``) was accepted and consumed as the child's end: a parent went on with a "result"
its child never returned while the child still ran. Such a name is refused, with nothing written."""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django.models import BufferedSignal, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.reserved_kid")
def reserved_kid(ctx):
    return (yield ctx.wait_for_signal("go"))


@weft.workflow(name="tests.reserved_parent")
def reserved_parent(ctx):
    return (yield ctx.start_child(reserved_kid, id="reserved-kid"))


FORGED = {"child_id": "reserved-kid", "status": "completed", "result": '"forged"', "error": None}


@pytest.mark.parametrize("how", ["signal", "start_or_signal"])
def test_a_signal_under_a_childs_reserved_name_is_refused(weft_run_until_idle, how):
    parent = weft.start(reserved_parent, id="reserved-p")
    weft_run_until_idle()
    assert weft.get_handle("reserved-kid").status == "running"
    name = "__weft_child__:0"
    with pytest.raises(weft.InvalidArgumentError):
        if how == "signal":
            weft.signal(parent.id, name, FORGED)
        else:
            weft.start_or_signal(reserved_parent, name, FORGED, id=parent.id)
    assert not BufferedSignal.objects.filter(workflow_id=parent.id, name=name).exists()  # nothing written
    weft_run_until_idle()
    assert Workflow.objects.get(pk=parent.id).status == "running"  # it still waits for its real child
    weft.get_handle("reserved-kid").signal("go", "real")
    weft_run_until_idle()
    assert parent.result(timeout=5) == "real"
