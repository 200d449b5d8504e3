"""The message cleanup runs on the engine's loop (every UPDATE_RESPONSE_RETENTION / 4): a row it
writes that a user's open transaction holds (a ``cancel()`` closing the run's admitted updates, a
``purge()`` deleting its settled ones, both inside the caller's ``transaction.atomic()``) must not
stall every other workflow of the engine for lock_timeout (half the claim TTL) on each of its runs
(PostgreSQL: row locks). Each case locks one message row in another connection, runs an engine, and
starts a good workflow: it must finish while the lock is still held."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings

import weft_django as weft
from tests.engine.test_commit_locks import holding
from tests.engine.test_locked_rows import _finishes_within
from weft_django.models import BufferedSignal, PendingUpdate, QueryRequest, Workflow
from weft_django.store.clock import db_now
from weft_django.testing import run_until_idle, running_engine

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _parked() -> Workflow:
    weft.start("tests.locked_rows.waits", id="held")  # waits for a signal: no handler for any update
    return Workflow.objects.get(pk="held")


def _abandoned_update() -> tuple[str, list[str]]:
    """An admitted update whose caller stopped waiting (and died) long ago: the cleanup expires it."""
    run, now = _parked(), db_now()
    pk = PendingUpdate.objects.create(
        workflow_id=run.pk,
        run_id=run.run_id,
        name="nobody-handles-it",
        payload="null",
        created_at=now - timedelta(minutes=2),
        deadline=now - timedelta(minutes=1),
    ).pk
    return "SELECT 1 FROM weft_django_pendingupdate WHERE id = %s FOR UPDATE", [str(pk)]


def _old_settled_update() -> tuple[str, list[str]]:
    """An update settled longer ago than the retention: the cleanup deletes it."""
    run, now = _parked(), db_now()
    pk = PendingUpdate.objects.create(
        workflow_id=run.pk,
        run_id=run.run_id,
        name="done",
        payload="null",
        status="completed",
        result="null",
        created_at=now - timedelta(hours=2),
        completed_at=now - timedelta(hours=2),
    ).pk
    return "SELECT 1 FROM weft_django_pendingupdate WHERE id = %s FOR UPDATE", [str(pk)]


def _old_query() -> tuple[str, list[str]]:
    """A query answered longer ago than the retention: the cleanup deletes it."""
    now = db_now()
    pk = QueryRequest.objects.create(
        id=uuid.uuid4(), workflow_id="held", name="q", status="answered", created_at=now - timedelta(hours=2)
    ).pk
    return "SELECT 1 FROM weft_django_queryrequest WHERE id = %s FOR UPDATE", [str(pk)]


def _late_signal() -> tuple[str, list[str]]:
    """A signal that committed for a run after it continued as new: the cleanup carries it to the
    current run (a ``cancel()`` of the workflow in an open transaction holds it: it closes every run's
    buffered signals of that workflow)."""
    from tests.deploys.test_continue_as_new import _chain, _on_old_run

    handle = weft.start("tests.deploys.counter", args=[1, 0], id="held-continued")
    handle.signal("add", 1)
    run_until_idle(timeout=20)
    ((old, _new),) = _chain(handle.id)
    late = _on_old_run(BufferedSignal, handle.id, old, name="add", payload="5")
    return "SELECT 1 FROM weft_django_bufferedsignal WHERE id = %s FOR UPDATE", [str(late.pk)]


CASES = {
    "abandoned-update": _abandoned_update,
    "settled-update": _old_settled_update,
    "query": _old_query,
    "late-signal": _late_signal,
}


@pytest.mark.parametrize("row", list(CASES))
@override_settings(WEFT={"UPDATE_RESPONSE_RETENTION": "1h", "WORKFLOW_CLAIM_TTL": "30s"})
def test_a_message_row_locked_by_a_user_does_not_stall_the_engine(row):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    sql, params = CASES[row]()
    with holding(sql, params, hold_at_most=40), running_engine("cleanup-engine"):
        time.sleep(1.5)  # the engine's first maintenance pass runs the message cleanup
        good = weft.start("tests.sum", args=[2, 3], id="good")
        took = _finishes_within(good, 25)
        assert took < 5, f"a good workflow took {took:.1f}s while one {row} row was locked"


@override_settings(WEFT={"RETENTION": {"completed": "1ms"}, "WORKFLOW_CLAIM_TTL": "30s"})
def test_a_finished_runs_claim_locked_by_a_user_does_not_stall_the_retention_sweep():
    """The retention chore purges finished runs on the engine's loop: one whose claim a user's open
    transaction holds (a ``purge()`` or ``retry()`` of it inside ``transaction.atomic()``) must not
    stall the engine's other workflows."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    weft.start("tests.sum", args=[1, 1], id="old")
    run_until_idle(timeout=20)
    sql = "SELECT 1 FROM weft_django_workflowclaim WHERE workflow_id = %s FOR UPDATE"
    with holding(sql, ["old"], hold_at_most=40), running_engine("retention-engine"):
        time.sleep(1.5)  # the engine's first maintenance pass runs the retention sweep
        good = weft.start("tests.sum", args=[2, 3], id="good")
        took = _finishes_within(good, 25)
        assert took < 5, f"a good workflow took {took:.1f}s while a finished run's claim was locked"
