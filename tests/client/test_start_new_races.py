"""start(on_conflict="start_new") over a finished run racing another start_new, a purge and a retry
of that run (PostgreSQL: threads on their own connections, released together by a barrier; the
callers held back in turn so that each comes first in some rounds).

Each locks the run's claim first: exactly one new run replaces the finished one (the other start
gets WorkflowAlreadyExistsError, "still running"), a purge either comes first (the start then
inserts a fresh run) or finds the run active (refused, typed), a retry either comes first (the
start is refused) or finds a running run (WorkflowStateError). Never two runs, a raw database error
or a hang.
"""

from __future__ import annotations

import json

import pytest

import weft_django as weft
from tests.races import alternate, race
from weft_django import transitions
from weft_django.models import Workflow, WorkflowClaim

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROUNDS = 8


def _ended(workflow_id: str, status: str = "completed") -> str:
    weft.start("tests.sum", args=[1, 2], id=workflow_id)
    Workflow.objects.filter(pk=workflow_id).update(status=status, result="3" if status == "completed" else None)
    return str(Workflow.objects.get(pk=workflow_id).run_id)


def _start_new(workflow_id: str, n: int):
    return lambda: weft.start("tests.sum", args=[n, n], id=workflow_id, on_conflict="start_new")


def test_two_start_new_over_one_finished_run_replace_it_once():
    for round_ in range(ROUNDS):
        workflow_id = f"sn2-{round_}"
        old_run = _ended(workflow_id)
        outcomes = race(_start_new(workflow_id, 10), _start_new(workflow_id, 20), delays=alternate(round_, 0.02))
        started = [o for o in outcomes if isinstance(o, weft.WorkflowHandle)]
        refused = [o for o in outcomes if not isinstance(o, weft.WorkflowHandle)]
        assert len(started) == 1 and len(refused) == 1, outcomes
        assert isinstance(refused[0], weft.WorkflowAlreadyExistsError) and "still running" in str(refused[0])
        row = Workflow.objects.get(pk=workflow_id)
        assert row.status == "running" and str(row.run_id) != old_run
        winner = 10 if started[0] is outcomes[0] else 20
        assert json.loads(row.input)["args"] == [winner, winner]  # the winner's run, whole


def test_start_new_racing_a_purge_of_the_finished_run_leaves_one_running_run():
    seen = set()
    for round_ in range(ROUNDS):
        workflow_id = f"snp-{round_}"
        _ended(workflow_id)
        started, purged = race(
            _start_new(workflow_id, 1),
            lambda w=workflow_id: transitions.purge([w]),
            delays=alternate(round_, 0.02),
        )
        assert isinstance(started, weft.WorkflowHandle), started
        assert not isinstance(purged, BaseException) or isinstance(purged, weft.WeftError), purged
        seen.add("purge refused or skipped it" if isinstance(purged, BaseException) or not purged else "purged first")
        assert Workflow.objects.filter(pk=workflow_id, status="running").count() == 1
        assert WorkflowClaim.objects.filter(pk=workflow_id).count() == 1
    print("start_new vs purge:", sorted(seen))


def test_start_new_racing_a_retry_of_the_failed_run_runs_it_once():
    seen = set()
    for round_ in range(ROUNDS):
        workflow_id = f"snr-{round_}"
        old_run = _ended(workflow_id, "failed")
        started, retried = race(
            _start_new(workflow_id, 1),
            lambda w=workflow_id: transitions.retry(w),
            delays=alternate(round_, 0.02),
        )
        row = Workflow.objects.get(pk=workflow_id)
        assert row.status == "running"
        if isinstance(started, weft.WorkflowHandle):
            seen.add("start_new first")
            assert isinstance(retried, weft.WorkflowStateError), retried
            assert str(row.run_id) != old_run
        else:
            seen.add("retry first")
            assert isinstance(started, weft.WorkflowAlreadyExistsError), started
            assert isinstance(retried, int), retried
            assert str(row.run_id) == old_run  # retried: the same run
    print("start_new vs retry:", sorted(seen))
