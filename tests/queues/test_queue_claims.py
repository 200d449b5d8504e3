"""The claims of queued runs (PostgreSQL and SQLite): a waiting run's claim is out of acquire's partial
index (``runnable`` False) until an engine admits it; then it is runnable, held, and the run runs.
Every start path is covered: start (PostgreSQL's one-statement start, with and without an idempotency
key, and the ORM path on SQLite) and start_many."""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.models import Workflow, WorkflowClaim
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

WEFT = {"QUEUES": {"one": {"concurrency": 1}, "tests-default": {}}, "POLL_INTERVAL": "50ms"}


def _runnable(ids: list[str]) -> dict[str, bool]:
    return dict(WorkflowClaim.objects.filter(workflow_id__in=ids).values_list("workflow_id", "runnable"))


@override_settings(WEFT=WEFT)
def test_a_queued_starts_claim_is_not_runnable_until_admitted():
    weft.start("tests.queued", id="qc-1", queue="one")
    keyed = weft.start("tests.queued", queue="one", idempotency_key="qc-2-key").id
    weft.start("tests.queued_default", id="qc-3")
    weft.start_many(
        [weft.StartRequest("tests.queued", queue="one", id="qc-4"), weft.StartRequest("tests.queued", id="qc-5")]
    )
    ids = ["qc-1", keyed, "qc-3", "qc-4"]
    assert _runnable([*ids, "qc-5"]) == {**dict.fromkeys(ids, False), "qc-5": True}
    run_until_idle()
    assert dict(Workflow.objects.filter(id__in=ids).values_list("id", "status")) == dict.fromkeys(ids, "completed")
    assert all(row is not None for row in Workflow.objects.filter(id__in=ids).values_list("admitted_at", flat=True))


@override_settings(WEFT=WEFT)
def test_a_cancelled_waiting_run_and_its_retry_leave_the_claim_consistent():
    handle = weft.start("tests.queued", id="qc-cancel", queue="one")
    handle.cancel()
    assert Workflow.objects.get(pk="qc-cancel").status == "cancelled"
    assert _runnable(["qc-cancel"]) == {"qc-cancel": False}
    run_until_idle()
    assert Workflow.objects.get(pk="qc-cancel").status == "cancelled"


@override_settings(WEFT=WEFT)
def test_a_queued_runs_execution_timeout_counts_from_its_admission():
    """The deadline is unset while the run waits in its queue and set at admission from the start's
    execution_timeout (before, it counted from the start: a run waiting long timed out before it ran)."""
    from datetime import timedelta

    from weft_django import conf
    from weft_django.store import queues

    weft.start("tests.queued", id="qt-1", queue="one", execution_timeout="1h")
    keyed = weft.start("tests.queued", queue="one", execution_timeout="2h", idempotency_key="qt-2-key").id
    weft.start_many([weft.StartRequest("tests.queued", queue="one", id="qt-3", execution_timeout="3h")])
    weft.start("tests.queued", id="qt-4", queue="one")
    ids = ["qt-1", keyed, "qt-3", "qt-4"]
    assert dict(Workflow.objects.filter(id__in=ids).values_list("id", "execution_deadline")) == dict.fromkeys(ids)
    hours = {"qt-1": 1, keyed: 2, "qt-3": 3}
    for wid in ids:
        got = queues.admit("qt-engine", conf.queues()["one"], limit=1, ttl=timedelta(seconds=30), using="default")
        assert list(got) == [wid]
        row = Workflow.objects.values("admitted_at", "execution_deadline").get(pk=wid)
        expected = row["admitted_at"] + timedelta(hours=hours[wid]) if wid in hours else None
        assert row["execution_deadline"] == expected
        Workflow.objects.filter(pk=wid).update(status="completed")  # frees the queue's one slot
