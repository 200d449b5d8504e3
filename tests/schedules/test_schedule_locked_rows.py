"""Schedule firing against one row a user's open transaction holds (PostgreSQL row locks). The firing
chore runs on the engine's loop and takes the schedule's row with SKIP LOCKED, but what firing writes
next waited for its rows: overlap="cancel_running" cancelling the previous run (its claim, its row, its
mail), and a run queued by overlap="queue" released into its workflow's queue (its row). Each pass waited
out the session's lock_timeout (15 s here) and failed, and every other workflow of the engine waited with
it. Now the schedule is left for a later pass (backed off) while its run's rows are held, and fires once
the lock goes; see tests/engine/locked.py for what is checked."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test import override_settings

import weft_django as weft
from tests.engine.locked import UPDATE_BLOCKERS, Held, Vitals, good_workflow_took, noisy, parked, row_lock
from weft_django.models import BufferedSignal, Workflow, WorkflowClaim
from weft_django.schedules import occurrence_id
from weft_django.testing import run_until_idle, running_engine, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
BASE = {"WORKFLOW_CLAIM_TTL": "30s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "100ms"}


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")


def _first_run_then_due(clock) -> tuple[str, str]:
    """Schedule "cr" (tests.signals every 60 s, cancel_running): its first run is running and its
    second occurrence is due. Returns (the first run's id, the second's)."""
    handle = weft.schedule("tests.signals", id="cr", every=60, overlap="cancel_running")
    first = handle.describe()["next_fire_times"][0]
    clock.advance((first - clock.now()).total_seconds() + 1)
    run_until_idle(timeout=20)
    first_id = occurrence_id("cr", first)
    assert Workflow.objects.get(pk=first_id).status == "running"
    weft.signal(first_id, "other", 1)  # buffered, never consumed: the cancel drops it
    second = handle.describe()["next_fire_times"][0]
    clock.advance((second - clock.now()).total_seconds() + 1)
    return first_id, occurrence_id("cr", second)


ROWS = {
    **{f"claim-{lock}": ("workflowclaim", "workflow_id", lock) for lock in UPDATE_BLOCKERS},
    "workflow": ("workflow", "id", "for-update"),
    "signal": ("bufferedsignal", "id", "for-update"),
}


@pytest.mark.parametrize("row", list(ROWS))
@override_settings(WEFT=BASE)
def test_a_row_of_the_run_to_cancel_locked_by_a_user_does_not_stall_the_engine(row, weft_clock, caplog):
    first, second = _first_run_then_due(weft_clock)
    table, column, lock = ROWS[row]
    value = BufferedSignal.objects.get(workflow_id=first).pk if table == "bufferedsignal" else first
    parked()
    with Held(*row_lock(table, column, value, lock)) as held, running_engine("schedule-engine"):
        wait_for(lambda: WorkflowClaim.objects.filter(pk="parked", engine_id="schedule-engine").exists(), 20)
        vitals = Vitals("schedule-engine", "parked")
        time.sleep(1.0)  # every firing pass meets the held row
        took = good_workflow_took()
        renewed, beating = vitals.moved_on()
        log = noisy(caplog.records)
        assert (took < 5, renewed, beating, log) == (True, True, True, []), (took, renewed, beating, log)
        assert Workflow.objects.get(pk=first).status == "running" and not held.released.is_set()
        assert not Workflow.objects.filter(pk=second).exists()  # not started beside the run it replaces
        held.let_go()
        wait_for(lambda: Workflow.objects.filter(pk=second, status="running").exists(), 20, message="the second run")
    assert Workflow.objects.get(pk=first).status == "cancelled"
    assert dict(Workflow.objects.filter(schedule_id="cr").values_list("pk", "status")) == {
        first: "cancelled",
        second: "running",
    }


@override_settings(WEFT={**BASE, "QUEUES": {"tests-default": {"concurrency": 5}}})
def test_a_queued_runs_row_locked_by_a_user_does_not_stall_its_release(caplog):
    """overlap="queue" of a workflow with a queue: once the slot frees, the firing chore moves the
    waiting run into its queue (enter_queue), an UPDATE of its row after its claim was locked."""
    handle = weft.schedule("tests.queued_counter", id="qr", every=3600, overlap="queue")
    first = handle.trigger().id
    waiting = handle.trigger().id
    assert Workflow.objects.get(pk=waiting).queue is None  # waiting outside any queue
    weft.get_handle(first).cancel("the slot frees")
    with Held(*row_lock("workflow", "id", waiting)) as held, running_engine("schedule-engine"):
        time.sleep(1.0)  # every firing pass tries to release it
        took = good_workflow_took()
        log = noisy(caplog.records)
        assert (took < 5, log) == (True, []), (took, log)
        assert Workflow.objects.get(pk=waiting).queue is None and not held.released.is_set()
        held.let_go()
        wait_for(lambda: Workflow.objects.filter(pk=waiting, status="running").exists(), 20, message="its admission")
    assert Workflow.objects.get(pk=waiting).queue == "tests-default"


@override_settings(WEFT=BASE)
def test_a_schedule_row_locked_by_a_user_is_passed_over_not_waited_for(weft_clock, caplog):
    """The firing chore takes each due schedule's row with SKIP LOCKED: one a user's transaction holds
    (an edit in progress) is passed over, the others fire, and it fires once the lock goes."""
    handles = [weft.schedule("tests.scheduled_run", id=s, every=60, overlap="allow") for s in ("held-s", "free-s")]
    due = max(handle.describe()["next_fire_times"][0] for handle in handles)
    weft_clock.advance((due - weft_clock.now()).total_seconds() + 1)
    with Held(*row_lock("schedule", "id", "held-s")) as held, running_engine("schedule-engine"):
        wait_for(lambda: Workflow.objects.filter(schedule_id="free-s").exists(), 20, message="free-s fired")
        took = good_workflow_took()
        log = noisy(caplog.records)
        assert (took < 5, log) == (True, []), (took, log)
        assert not Workflow.objects.filter(schedule_id="held-s").exists() and not held.released.is_set()
        held.let_go()
        wait_for(lambda: Workflow.objects.filter(schedule_id="held-s").exists(), 20, message="held-s fired")
