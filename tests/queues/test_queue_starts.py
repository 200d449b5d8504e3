"""Every way of starting a run honours ``@weft.workflow(queue=)`` (PostgreSQL and SQLite):
start_or_signal, start_with_update and weft.fork start a queued workflow's run pending in its queue,
where an engine admits it. (Before, the three wrote the run ``running`` outside the queue.)"""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.models import Workflow
from weft_django.testing import run_until_idle, running_engine

pytestmark = pytest.mark.django_db(transaction=True)

WEFT = {"QUEUES": {"tests-default": {"concurrency": 5}}, "POLL_INTERVAL": "50ms"}


def _row(workflow_id: str) -> dict:
    return Workflow.objects.filter(pk=workflow_id).values("status", "queue", "admitted_at").get()


@override_settings(WEFT=WEFT)
def test_start_or_signal_starts_a_queued_workflow_in_its_queue():
    handle, outcome = weft.start_or_signal("tests.queued_counter", "stop", None, id="sos-q")
    assert outcome == "started"
    assert _row("sos-q") == {"status": "pending", "queue": "tests-default", "admitted_at": None}
    run_until_idle()
    row = _row("sos-q")
    assert (row["status"], row["admitted_at"] is not None) == ("completed", True)
    assert handle.result(timeout=5) == 0


@override_settings(WEFT=WEFT)
def test_start_with_update_starts_a_queued_workflow_in_its_queue():
    with running_engine("swu-q-engine"):
        handle, result = weft.start_with_update("tests.queued_counter", "add", 5, id="swu-q", timeout="20s")
        assert result == 5
        row = _row("swu-q")
        assert (row["status"], row["queue"], row["admitted_at"] is not None) == ("running", "tests-default", True)
        weft.signal("swu-q", "stop")
        assert handle.result(timeout=20) == 5


@override_settings(WEFT=WEFT)
def test_fork_of_a_queued_workflow_waits_in_its_queue():
    weft.start("tests.queued_default", id="fork-q-src")
    run_until_idle()
    assert _row("fork-q-src")["status"] == "completed"
    fork = weft.fork("fork-q-src", from_step=1, new_id="fork-q-new")
    assert _row("fork-q-new") == {"status": "pending", "queue": "tests-default", "admitted_at": None}
    run_until_idle()
    row = _row("fork-q-new")
    assert (row["status"], row["admitted_at"] is not None) == ("completed", True)
    assert fork.result(timeout=5) == weft.get_handle("fork-q-src").result(timeout=5)
