"""A parent that failed at another step while its child ran (``ctx.race``: the child and a signal wait
that timed out) still waits for that child once it is retried: the retry removes only the failing
step, so the child step stays recorded as running and its end is the one thing that settles it.
The child ends while the parent is failed: its end record goes into the failed run's mailbox, a
late signal of a run that is not active, and the message cleanup drops it (or the parent's own
terminal commit dropped it, when the child ended first). The retried parent then waited for ever for
a child that had ended."""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.engine.test_purged_parent_child_end import cleanup_messages, orphan_kid
from weft_django.models import BufferedSignal, Workflow

pytestmark = pytest.mark.django_db(transaction=True)
FAILS = {"on": True}


@weft.workflow(name="tests.rpce_parent")
def rpce_parent(ctx):
    first = yield ctx.race(
        [
            ctx.start_child(orphan_kid, id="rpce-kid", parent_close_policy="abandon"),
            ctx.wait_for_signal("never", timeout="1ms" if FAILS["on"] else None),
        ]
    )
    return list(first)


def test_a_retried_parent_gets_the_end_of_a_child_that_ended_while_it_was_failed(weft_run_until_idle, weft_clock):
    FAILS["on"] = True
    parent = weft.start(rpce_parent, id="rpce-p")
    weft_run_until_idle()
    assert parent.status == "failed"
    kid = weft.get_handle("rpce-kid")
    assert kid.status == "running"
    kid.signal("go", 7)
    weft_run_until_idle()
    assert kid.result(timeout=5) == 7
    cleanup_messages()  # the message cleanup of any engine, before someone retries the parent
    FAILS["on"] = False
    parent.retry()
    weft_run_until_idle()
    records = list(BufferedSignal.objects.filter(workflow_id="rpce-p").values_list("signal_id", "state"))
    row = Workflow.objects.get(pk="rpce-p")
    assert row.status == "completed", f"the retried parent waits for ever for its ended child ({row.status}; {records})"
    assert parent.result(timeout=5) == [0, 7]
