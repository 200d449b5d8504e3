"""The next run of a continued queued workflow (PostgreSQL and SQLite): its claim is released at the
continuation, and only an engine that serves its queue may acquire it (before, any engine could,
including one started with ``--queues`` naming other queues). Runs without a queue stay acquirable by
every engine. Also: ``carry_late`` wakes the workflows it moved signals or updates to."""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import ContinuedRun, Workflow, WorkflowClaim
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

WEFT = {"QUEUES": {"tests-default": {"concurrency": 5}, "other": {}}, "POLL_INTERVAL": "50ms"}


@override_settings(WEFT=WEFT)
def test_the_next_run_of_a_continued_queued_workflow_is_acquired_only_by_engines_serving_its_queue():
    weft.start("tests.queued_continues", id="cont-q")
    weft.start("tests.signals", id="cont-plain")  # no queue: any engine may acquire it
    run_until_idle()
    row = Workflow.objects.values("status", "queue", "admitted_at").get(pk="cont-q")
    assert (row["status"], row["queue"], row["admitted_at"] is not None) == ("running", "tests-default", True)
    assert ContinuedRun.objects.filter(workflow_id="cont-q").exists()
    assert WorkflowClaim.objects.filter(workflow_id="cont-q", engine_id__isnull=True, runnable=True).exists()

    elsewhere = Engine("cont-other-engine", queues=["other"])
    claimed = elsewhere.claimer.claim(force=True, scan=False)
    assert "cont-q" not in claimed
    assert "cont-plain" in claimed
    assert WorkflowClaim.objects.get(workflow_id="cont-q").engine_id is None

    serving = Engine("cont-serving-engine", queues=["tests-default"])
    assert "cont-q" in serving.claimer.claim(force=True, scan=False)


@pytest.mark.postgres
@override_settings(WEFT=WEFT)
def test_carry_late_wakes_the_workflows_it_moved_messages_to():
    """A signal that committed for the old run after the continuation is moved to the new run by the
    mailbox sweep, which now also sends the workflow's ``w:`` wake-up (before: none, so it waited for
    an engine's poll)."""
    from weft_django.models import BufferedSignal
    from weft_django.store import continuation, notify

    weft.start("tests.queued_continues", id="cont-late")
    run_until_idle()
    old = ContinuedRun.objects.get(workflow_id="cont-late").run_id
    BufferedSignal.objects.create(
        workflow_id="cont-late",
        run_id=old,
        name="go",
        payload='"late"',
        created_at=Workflow.objects.get(pk="cont-late").updated_at,
    )
    listener = notify.connect("default")
    try:
        notify.listen(listener)
        assert continuation.carry_late("default") == 1
        payloads = []
        for note in listener.notifies(timeout=10):
            payloads.append(note.payload)
            if note.payload == "w:cont-late":
                break
        assert "w:cont-late" in payloads
    finally:
        listener.close()
    run_until_idle()
    assert weft.get_handle("cont-late").result(timeout=10) == "late"
