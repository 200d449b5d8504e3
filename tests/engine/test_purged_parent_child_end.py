"""A child abandoned by a parent that was then purged still reports its end into the parent's mailbox,
under the purged id. Before the fix nothing ever deleted that record: the message cleanup marked it
dropped and it stayed for ever (one row per abandoned child, never purged, shown under the id of a
workflow that no longer exists). Now the cleanup deletes mail of a workflow that does not exist."""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django import transitions
from weft_django.models import BufferedSignal
from weft_django.store import mailbox
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.orphan_kid")
def orphan_kid(ctx):
    got = yield ctx.wait_for_signal("go")
    return got


@weft.workflow(name="tests.orphan_parent")
def orphan_parent(ctx):
    yield ctx.race([ctx.start_child(orphan_kid, id="orph-kid", parent_close_policy="abandon"), ctx.sleep("1ms")])
    return "parent done"


def cleanup_messages() -> None:
    """Run the message cleanup (as any engine does every UPDATE_RESPONSE_RETENTION / 4) until it is done."""
    now = db_now("default")
    while mailbox.cleanup(now, now, mailbox.timedelta(seconds=10), "default"):
        pass


def test_the_end_record_of_a_purged_parents_child_is_deleted(weft_run_until_idle, weft_clock):
    parent = weft.start(orphan_parent, id="orph-p")
    weft_run_until_idle()
    assert parent.result(timeout=5) == "parent done"
    kid = weft.get_handle("orph-kid")
    assert kid.status == "running"
    transitions.purge("orph-p")
    kid.signal("go", 1)
    weft_run_until_idle()
    assert kid.result(timeout=5) == 1
    assert mailbox.drop_late_signals("default") == 1  # the run is gone: its late mail is deleted
    cleanup_messages()
    left = list(BufferedSignal.objects.filter(workflow_id="orph-p").values_list("name", "state"))
    assert left == [], f"mail of a purged workflow is kept for ever: {left}"
