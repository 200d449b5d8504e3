"""A queued workflow's run enters its queue however it starts again (PostgreSQL and SQLite): a
schedule's occurrence and retry() of a failed run wait ``pending`` in the workflow's queue until an
engine admits them. (Before, both wrote the run ``running`` outside the queue and its limits.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django import conf
from weft_django.exceptions import UnknownQueueError
from weft_django.models import Workflow, WorkflowClaim
from weft_django.store import queues
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

WEFT = {"QUEUES": {"tests-default": {"concurrency": 1}}, "POLL_INTERVAL": "50ms"}
TTL = timedelta(seconds=30)


def _row(workflow_id: str) -> dict:
    row = Workflow.objects.filter(pk=workflow_id).values("status", "queue", "admitted_at", "execution_deadline").get()
    row["runnable"] = WorkflowClaim.objects.get(pk=workflow_id).runnable
    return row


def _admit(engine_id: str = "reentry-engine") -> dict[str, int]:
    return queues.admit(engine_id, conf.queues()["tests-default"], limit=5, ttl=TTL, using="default")


WAITING = {"status": "pending", "queue": "tests-default", "admitted_at": None, "execution_deadline": None}


@override_settings(WEFT=WEFT)
def test_a_schedules_run_of_a_queued_workflow_waits_in_its_queue():
    handle = weft.schedule("tests.queued_default", id="sq-every", every="1h", overlap="allow")
    run = handle.trigger()
    assert run is not None
    assert _row(run.id) == {**WAITING, "runnable": False}
    assert handle.describe()["running_ids"] == [run.id]
    run_until_idle()
    row = _row(run.id)
    assert (row["status"], row["admitted_at"] is not None) == ("completed", True)


@override_settings(WEFT=WEFT)
def test_a_schedules_queued_run_counts_for_skip_and_waits_behind_the_queue_limit():
    weft.start("tests.queued_counter", id="sq-holder")
    assert list(_admit()) == ["sq-holder"]  # the queue's one slot is taken
    handle = weft.schedule("tests.queued_default", id="sq-skip", every="1h", overlap="skip")
    first = handle.trigger()
    assert first is not None and _row(first.id) == {**WAITING, "runnable": False}
    assert handle.trigger() is None  # overlap="skip": the pending run in the queue occupies the slot
    assert _admit() == {}  # the queue is full: the schedule's run waits like any start
    weft.cancel("sq-holder")
    run_until_idle()
    assert _row(first.id)["status"] == "completed"


@override_settings(WEFT=WEFT)
def test_a_schedules_overlap_queue_run_of_a_queued_workflow_enters_its_queue_when_released():
    handle = weft.schedule("tests.queued_counter", id="sq-queue", every="1h", overlap="queue")
    first = handle.trigger()
    assert first is not None and _row(first.id) == {**WAITING, "runnable": False}
    second = handle.trigger()
    assert second is not None  # overlap="queue": waits for the schedule's slot, out of the workflow's queue
    assert Workflow.objects.get(pk=second.id).status == "pending"
    assert handle.trigger() is None  # one occurrence waits already
    run_until_idle()
    assert _row(first.id)["status"] == "running"
    assert Workflow.objects.get(pk=second.id).admitted_at is None  # not released while the first runs
    weft.signal(first.id, "stop")
    run_until_idle()
    run_until_idle()  # one pass releases it into the queue, the next admits it
    assert _row(first.id)["status"] == "completed"
    row = _row(second.id)
    assert (row["status"], row["queue"], row["admitted_at"] is not None) == ("running", "tests-default", True)
    weft.signal(second.id, "stop")
    run_until_idle()
    assert _row(second.id)["status"] == "completed"


@override_settings(WEFT=WEFT)
def test_retry_of_a_queued_workflows_failed_run_waits_for_admission():
    weft.start("tests.queued_fails_once", id="rq-fail", execution_timeout="1h")
    run_until_idle()
    assert _row("rq-fail")["status"] == "failed"
    weft.start("tests.queued_counter", id="rq-holder")
    assert list(_admit()) == ["rq-holder"]  # the queue's one slot is taken
    weft.get_handle("rq-fail").retry()
    assert _row("rq-fail") == {**WAITING, "runnable": False}
    assert _admit() == {}  # the slot is still taken: the retried run waits its turn
    assert _row("rq-fail")["status"] == "pending"
    weft.cancel("rq-holder")
    assert list(_admit()) == ["rq-fail"]
    row = _row("rq-fail")
    assert (row["status"], row["runnable"]) == ("running", True)
    assert row["execution_deadline"] is not None and row["execution_deadline"] > row["admitted_at"]


def test_retry_of_a_run_whose_queue_is_gone_says_so_and_changes_nothing():
    with override_settings(WEFT=WEFT):
        weft.start("tests.queued_fails_once", id="rq-gone")
        run_until_idle()
    assert _row("rq-gone")["status"] == "failed"
    gone = override_settings(WEFT={"QUEUES": {"other": {"concurrency": 1}}})
    with gone, pytest.raises(UnknownQueueError, match='queue "tests-default", which is no longer in WEFT'):
        weft.get_handle("rq-gone").retry()
    row = _row("rq-gone")
    assert (row["status"], row["admitted_at"] is not None, row["runnable"]) == ("failed", True, False)
