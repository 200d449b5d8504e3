"""The engine's own chores against one row a user's open transaction holds (PostgreSQL row locks): the
delayed starts, the orphaned-timer sweep, the retention purge, the message cleanup's late mail of a
purged workflow. Each ran a plain write on the engine's
loop, which waited out the session's lock_timeout (half the claim TTL, 15 s here) for the row, on every
pass or chore run: every other workflow of the engine waited with it. Now the row is skipped (its work
left for a later pass) and done once the lock goes; see tests/engine/locked.py for what is checked."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings

import weft_django as weft
from tests.engine.locked import Held, Vitals, good_workflow_took, noisy, parked, row_lock
from weft_django.models import (
    BufferedSignal,
    ContinuedRun,
    IdempotencyKey,
    QueryRequest,
    Step,
    Timer,
    Workflow,
    WorkflowAttribute,
    WorkflowClaim,
)
from weft_django.store.clock import db_now
from weft_django.testing import run_until_idle, running_engine, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
BASE = {"WORKFLOW_CLAIM_TTL": "30s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "100ms"}


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")


# -- delayed starts --------------------------------------------------------------------------------


@pytest.mark.parametrize("lock", ["for-update", "for-share", "for-key-share"])
@override_settings(WEFT=BASE)
def test_a_delayed_start_timer_locked_by_a_user_leaves_the_others_running(lock, caplog):
    """The delayed starts (claimer, each maintenance pass) lock the due runs' claims and rows skipping
    held ones, then deleted their timers with a plain DELETE: a timer row a user held stalled the pass,
    and the DatabaseError that ended the wait reloaded every workflow of the engine, pass after pass."""
    parked()
    weft.start("tests.sum", args=[1, 2], id="held", start_after=timedelta(seconds=1))
    pk = Timer.objects.get(workflow_id="held", kind="delayed_start").pk
    with Held(*row_lock("timer", "id", pk, lock)) as held, running_engine("chore-engine"):
        wait_for(lambda: WorkflowClaim.objects.filter(pk="parked", engine_id="chore-engine").exists(), 20)
        vitals = Vitals("chore-engine", "parked")
        time.sleep(1.5)  # the delayed start is due: every maintenance pass tries to start it
        took = good_workflow_took()
        renewed, beating = vitals.moved_on()
        log = noisy(caplog.records)
        assert (took < 5, renewed, beating, log) == (True, True, True, []), (took, renewed, beating, log)
        assert Workflow.objects.get(pk="held").status == "pending" and not held.released.is_set()
        held.let_go()
        assert weft.get_handle("held").result(timeout=20) == {"total": 3}
    assert not Timer.objects.filter(workflow_id="held").exists()
    assert Step.objects.filter(workflow_id="held").count() == 1


# -- the orphaned-timer sweep ----------------------------------------------------------------------


@override_settings(WEFT=BASE)
def test_an_orphaned_timer_locked_by_a_user_does_not_stall_the_timer_sweep(caplog, monkeypatch):
    """The sweep deletes the timers of missing or ended workflows on the engine's loop: one a user held
    kept every workflow of the engine waiting for it (once a cycle), and failed the chore."""
    monkeypatch.setattr("weft_django.engine.sweeps.INTERVAL", 0.5)
    parked()
    gone = Timer.objects.create(workflow_id="gone", run_id=uuid.uuid4(), kind="sleep", seq=0, fire_at=db_now())
    other = Timer.objects.create(workflow_id="gone-too", run_id=uuid.uuid4(), kind="sleep", seq=0, fire_at=db_now())
    with Held(*row_lock("timer", "id", gone.pk)) as held, running_engine("chore-engine"):
        took = good_workflow_took()  # the sweep runs on the engine's first pass
        log = noisy(caplog.records)
        assert (took < 5, log) == (True, []), (took, log)
        wait_for(lambda: not Timer.objects.filter(pk=other.pk).exists(), 10, message="the free orphan collected")
        assert Timer.objects.filter(pk=gone.pk).exists() and not held.released.is_set()
        held.let_go()
        wait_for(lambda: not Timer.objects.filter(pk=gone.pk).exists(), 10, message="the held orphan collected")


# -- retention -------------------------------------------------------------------------------------


def _expired_runs() -> tuple[str, str, dict[str, object]]:
    """Two failed runs past their retention: (the one with a row of every table a purge deletes from or
    writes, the other, {table: that row's key})."""
    old, free = (weft.start("tests.fails", idempotency_key=f"{name}-key").id for name in ("old", "free"))
    run_until_idle(timeout=20)
    run, now = Workflow.objects.get(pk=old).run_id, db_now()
    return (
        old,
        free,
        {
            "step": Step.objects.filter(workflow_id=old).first().pk,
            "bufferedsignal": BufferedSignal.objects.create(
                workflow_id=old, run_id=run, name="s", payload="1", state="dropped", created_at=now
            ).pk,
            "queryrequest": QueryRequest.objects.create(
                workflow_id=old, name="q", status="answered", created_at=now
            ).pk,
            "workflowattribute": WorkflowAttribute.objects.create(
                workflow_id=old, name="a", kind="str", str_value="v"
            ).pk,
            "continuedrun": ContinuedRun.objects.create(
                workflow_id=old,
                run_id=uuid.uuid4(),
                next_run_id=run,
                workflow_type="tests.fails",
                version="1",
                input="{}",
                finished_at=now,
            ).pk,
            "idempotencykey": "old-key",
            "workflowclaim": old,
            "workflow": old,
        },
    )


RETENTION_ROWS = {
    "step": ("step", "id", "for-update"),
    "step-shared": ("step", "id", "for-share"),
    "step-key-shared": ("step", "id", "for-key-share"),
    "signal": ("bufferedsignal", "id", "for-update"),
    "query": ("queryrequest", "id", "for-update"),
    "attribute": ("workflowattribute", "id", "for-update"),
    "continued": ("continuedrun", "id", "for-update"),
    "idempotency-key": ("idempotencykey", "key", "for-update"),
    "claim-key-shared": ("workflowclaim", "workflow_id", "for-key-share"),
    "workflow-key-shared": ("workflow", "id", "for-key-share"),
}


@pytest.mark.parametrize("row", list(RETENTION_ROWS))
@override_settings(WEFT={**BASE, "RETENTION": {"failed": "1ms", "completed": None}})
def test_a_row_of_an_expired_run_locked_by_a_user_does_not_stall_retention(row, caplog, monkeypatch):
    """The retention sweep purges on the engine's loop: it skipped runs whose claim or workflow row a
    user held, but deleted their other rows (steps, mail, attributes, the idempotency key's mark...)
    with plain statements, which waited for a held one: the engine stalled, the chore failed, and the
    other expired runs of the batch were not purged either. Now the run whose row is held is left for a
    later pass; the others are purged."""
    monkeypatch.setattr("weft_django.engine.retention.INTERVAL", 0.5)
    old, free, keys = _expired_runs()
    table, column, lock = RETENTION_ROWS[row]
    parked()
    with Held(*row_lock(table, column, keys[table], lock)) as held, running_engine("chore-engine"):
        took = good_workflow_took()  # the retention sweep runs on the engine's first pass
        wait_for(lambda: not Workflow.objects.filter(pk=free).exists(), 10, message="the other run purged")
        log = noisy(caplog.records)
        assert (took < 5, log) == (True, []), (took, log)
        assert Workflow.objects.filter(pk=old).exists() and not held.released.is_set()
        held.let_go()
        wait_for(lambda: not Workflow.objects.filter(pk=old).exists(), 10, message="the held run purged")
    left = {
        model.__name__: model.objects.filter(workflow_id=old).count()
        for model in (Step, BufferedSignal, QueryRequest, WorkflowAttribute, ContinuedRun, WorkflowClaim)
    }
    assert set(left.values()) == {0}, left
    assert IdempotencyKey.objects.get(pk="old-key").purged_at is not None
    assert Workflow.objects.get(pk="good").status == "completed"  # completed runs are kept (None)


# -- the message cleanup: late mail of a purged workflow ---------------------------------------------


@override_settings(WEFT={**BASE, "UPDATE_RESPONSE_RETENTION": "4s"})
def test_late_mail_of_a_purged_workflow_locked_by_a_user_does_not_stall_the_cleanup(caplog):
    """A child abandoned by a purged parent reports its end under the purged id: the cleanup deletes
    that record (no workflow is left to mark it dropped) with a plain DELETE, which waited for it while
    a user held it, on the engine's loop, once per cleanup interval."""
    parked()
    now = db_now()
    late = [
        BufferedSignal.objects.create(
            workflow_id=wid, run_id=uuid.uuid4(), name="__weft_child__:0", payload="{}", created_at=now
        ).pk
        for wid in ("purged-parent", "purged-too")
    ]
    with Held(*row_lock("bufferedsignal", "id", late[0])) as held, running_engine("chore-engine"):
        took = good_workflow_took()  # the cleanup runs on the engine's first pass
        log = noisy(caplog.records)
        assert (took < 5, log) == (True, []), (took, log)
        wait_for(lambda: not BufferedSignal.objects.filter(pk=late[1]).exists(), 10, message="the free one")
        assert BufferedSignal.objects.filter(pk=late[0]).exists() and not held.released.is_set()
        held.let_go()
        wait_for(lambda: not BufferedSignal.objects.filter(pk=late[0]).exists(), 10, message="the held one deleted")
