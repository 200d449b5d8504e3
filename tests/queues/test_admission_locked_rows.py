"""Queue admission and activity slots against one row a user's open transaction holds (PostgreSQL row
locks; their advisory locks: tests/queues/test_lock_skips.py). Admission and the slots run on the engine's
loop: a plain write that waited for a held row (the session's lock_timeout, 15 s here) stalled every
other workflow of the engine, on every pass. Now the held row is skipped and its work done once the lock
goes; see tests/engine/locked.py for what is checked."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings

import weft_django as weft
from tests.engine.locked import (
    UPDATE_BLOCKERS,
    Held,
    Vitals,
    finishes_within,
    good_workflow_took,
    noisy,
    parked,
    row_lock,
)
from tests.engine.test_commit_locks import holding
from weft_django.models import ActivitySlot, Workflow, WorkflowClaim
from weft_django.store.clock import db_now
from weft_django.testing import running_engine, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
BASE = {"WORKFLOW_CLAIM_TTL": "30s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "100ms"}
LIMITED = "tests.testapp.queue_workflows.limited_work"  # concurrency=2


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")


def _holds(engine_id: str, workflow_id: str = "parked") -> None:
    wait_for(lambda: WorkflowClaim.objects.filter(pk=workflow_id, engine_id=engine_id).exists(), 20)


@pytest.mark.parametrize("lock", UPDATE_BLOCKERS)
@override_settings(WEFT={**BASE, "QUEUES": {"one": {"concurrency": 5}}})
def test_a_waiting_runs_row_locked_by_a_user_does_not_stall_admission(lock, caplog):
    """Admission locks the chosen runs' claims skipping held ones, then made them running with a plain
    UPDATE of their rows: a waiting run's row a user held kept the admission (and the engine's loop)
    waiting, then failed it, so no run of the queue was admitted and every pass began again."""
    parked()
    weft.start("tests.queued", id="held", queue="one")
    with Held(*row_lock("workflow", "id", "held", lock)) as held, running_engine("queue-engine"):
        _holds("queue-engine")
        vitals = Vitals("queue-engine", "parked")
        took_queued = finishes_within(weft.start("tests.queued", id="good-q", queue="one"), 20)
        took = good_workflow_took()
        renewed, beating = vitals.moved_on()
        log = noisy(caplog.records)
        outcome = (took_queued < 5, took < 5, renewed, beating, log)
        assert outcome == (True, True, True, True, []), (took_queued, took, renewed, beating, log)
        assert Workflow.objects.get(pk="held").status == "pending" and not held.released.is_set()
        held.let_go()
        assert isinstance(weft.get_handle("held").result(timeout=20), int)
    assert Workflow.objects.filter(queue="one", admitted_at__isnull=False).count() == 2


@pytest.mark.parametrize("lock", UPDATE_BLOCKERS)
@override_settings(WEFT=BASE)
def test_a_slot_locked_by_a_user_does_not_stall_its_release(lock, caplog):
    """An attempt's slot is released on the engine's loop once the attempt ended: a slot row a user held
    stalled the loop for the whole lock wait, each time it was tried. Now it is released once free."""
    parked()
    with running_engine("slot-engine"):
        _holds("slot-engine")
        handle = weft.start("tests.limited", args=[1, 1.0], id="held")
        slot = wait_for(
            lambda: ActivitySlot.objects.filter(workflow_id="held").values_list("pk", flat=True).first(), 20
        )
        with holding(*row_lock("activityslot", "id", slot, lock), hold_at_most=40) as released:
            took_held = finishes_within(handle, 20)  # its attempt ends after 1 s: its slot is released then
            took = good_workflow_took()
            log = noisy(caplog.records)
            assert (took_held < 5, took < 5, log) == (True, True, []), (took_held, took, log)
            assert ActivitySlot.objects.get(pk=slot).released_at is None and not released.is_set()
        wait_for(lambda: ActivitySlot.objects.get(pk=slot).released_at is not None, 10, message="the slot released")
    assert len(handle.result(timeout=1)) == 1


@pytest.mark.parametrize("lock", ["for-update", "for-key-share"])
@override_settings(WEFT=BASE)
def test_an_old_slot_locked_by_a_user_does_not_stall_the_next_attempt(lock, caplog):
    """Taking a slot deletes the activity's slots older than its window on the way: one a user held
    stalled the dispatch (and the loop) for the lock wait, then refused the slot, every RETRY."""
    parked()
    long_ago = db_now() - timedelta(minutes=5)
    old = ActivitySlot.objects.create(
        activity=LIMITED,
        workflow_id="gone",
        run_id=uuid.uuid4(),
        seq=0,
        attempt=1,
        epoch=1,
        engine_id="gone-engine",
        acquired_at=long_ago,
        released_at=long_ago,
    )
    with running_engine("slot-engine"):
        _holds("slot-engine")
        with holding(*row_lock("activityslot", "id", old.pk, lock), hold_at_most=40) as released:
            took_limited = finishes_within(weft.start("tests.limited", args=[1, 0], id="limited"), 20)
            took = good_workflow_took()
            log = noisy(caplog.records)
            assert (took_limited < 5, took < 5, log) == (True, True, []), (took_limited, took, log)
            assert ActivitySlot.objects.filter(pk=old.pk).exists() and not released.is_set()
        assert len(weft.start("tests.limited", args=[1, 0], id="limited-after").result(timeout=20)) == 1
    assert not ActivitySlot.objects.filter(pk=old.pk).exists()  # deleted by a later take


@pytest.mark.parametrize(("table", "column"), [("workflow", "id"), ("workflowclaim", "workflow_id")])
@override_settings(WEFT={**BASE, "QUEUES": {"solo": {"concurrency": 1}}})
def test_a_held_head_of_its_queue_does_not_keep_the_runs_behind_it_waiting(table, column, caplog):
    """Admission chose as many waiting runs as the queue had free slots, in order, then skipped those whose
    row or claim a user's open transaction held: with one free slot it chose the head alone, skipped it,
    and admitted nothing, on every pass, for as long as the lock was held (the queue's slot stayed free).
    Now a held run is passed over for this pass, the next ones in order take its place, and it is
    admitted once free (the order among the others kept)."""
    parked()
    weft.start("tests.queued", id="head", queue="solo")
    behind = [weft.start("tests.queued", id=f"behind-{n}", queue="solo") for n in range(2)]
    with Held(*row_lock(table, column, "head")) as held, running_engine("queue-engine"):
        _holds("queue-engine")
        took = [finishes_within(handle, 20) for handle in behind]
        log = noisy(caplog.records)
        assert (all(t < 10 for t in took), log) == (True, []), (took, log)
        admitted = Workflow.objects.filter(pk__startswith="behind-").order_by("admitted_at", "id")
        assert list(admitted.values_list("pk", flat=True)) == ["behind-0", "behind-1"]
        assert Workflow.objects.get(pk="head").status == "pending" and not held.released.is_set()
        held.let_go()
        assert isinstance(weft.get_handle("head").result(timeout=20), int)
