"""The fenced commit's less travelled writes against one row a user's open transaction holds (PostgreSQL
row locks): search attributes (the rows ``set_attributes`` replaces), continue-as-new (the buffered signal
it carries to the next run) and a run's end (the workflow row of the child it closes). The commit waits
100 ms at most for such a row (``store.sessions.COMMIT_LOCK_WAIT_MS``), then carries that workflow's
writes and tries them again alone with back-off (``engine/containment.py``): the other workflows commit,
and the held one's writes land once, whole, when the lock goes (the rows of tests/engine/test_locked_rows.py
were the workflow, step, signal and timer rows of plain progress)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

import tests.testapp.deploy_chain  # noqa: F401  (registers tests.deploys.counter)
import weft_django as weft
from tests.engine.locked import Held, good_workflow_took, noisy, row_lock
from weft_django.models import BufferedSignal, ContinuedRun, Step, Workflow, WorkflowAttribute
from weft_django.testing import run_until_idle, running_engine, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
DEFERRED = "fenced commit deferred workflow=held"
BASE = {"WORKFLOW_CLAIM_TTL": "30s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "100ms"}


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")


@weft.workflow(name="tests.locked.parent")
def parent(ctx: Any) -> Any:
    """Ends on the signal "end" while its child still runs: its end closes the child."""
    kid = ctx.start_child("tests.locked.parked", id=f"{ctx.workflow_id}-kid", parent_close_policy="terminate")
    _, value = yield ctx.race([kid, ctx.wait_for_signal("end")])
    return value


def _status(workflow_id: str) -> str:
    return str(Workflow.objects.get(pk=workflow_id).status)


@pytest.mark.parametrize("lock", ["for-update", "for-share"])
@override_settings(WEFT=BASE)
def test_a_search_attribute_row_locked_by_a_user_does_not_stall_the_others(lock, caplog):
    handle = weft.start("visibility.order", args=["ada", 120.0], id="held", attributes={"stage": "new"})
    stage = WorkflowAttribute.objects.get(workflow_id="held", name="stage").pk
    with Held(*row_lock("workflowattribute", "id", stage, lock)) as held, running_engine("commit-engine"):
        took = good_workflow_took()
        log = noisy(caplog.records, at_most=4)  # the deferral is told for each of its few tries
        assert (took < 5, log) == (True, []), (took, log)
        wait_for(lambda: DEFERRED in caplog.text, 10, message="its commit deferred")  # the lock was met
        assert not Step.objects.filter(workflow_id="held").exists() and not held.released.is_set()
        held.let_go()
        assert handle.result(timeout=20) == ["charge:v1", "ship:v1"]
    assert Step.objects.filter(workflow_id="held").count() == 2  # each activity once
    stages = WorkflowAttribute.objects.filter(workflow_id="held", name="stage").values_list("str_value", flat=True)
    assert list(stages) == ["shipped"]


@override_settings(WEFT=BASE)
def test_a_carried_signal_locked_by_a_user_does_not_stall_the_others(caplog):
    handle = weft.start("tests.deploys.counter", args=[0, 0], id="held")
    handle.signal("add", 1)
    handle.signal("add", 2)
    carried = BufferedSignal.objects.filter(workflow_id="held").order_by("pk").last().pk
    with Held(*row_lock("bufferedsignal", "id", carried)) as held, running_engine("commit-engine"):
        took = good_workflow_took()
        log = noisy(caplog.records, at_most=4)
        assert (took < 5, log) == (True, []), (took, log)
        wait_for(lambda: DEFERRED in caplog.text, 10, message="its commit deferred")  # the lock was met
        assert not ContinuedRun.objects.filter(workflow_id="held").exists() and not held.released.is_set()
        held.let_go()
        wait_for(lambda: ContinuedRun.objects.filter(workflow_id="held").count() == 2, 20, message="two runs on")
        handle.signal("add", 3)
        assert handle.result(timeout=20) == {"runs": 3, "total": 6}
    runs = list(ContinuedRun.objects.filter(workflow_id="held").values_list("run_id", flat=True))
    assert [Step.objects.filter(run_id=run).count() for run in runs] == [1, 1]  # each signal consumed once


@override_settings(WEFT=BASE)
def test_a_child_row_locked_by_a_user_does_not_stall_the_others_when_its_parent_ends(caplog):
    weft.start("tests.locked.parent", id="held")
    run_until_idle(timeout=20)
    assert (_status("held"), _status("held-kid")) == ("running", "running")
    with Held(*row_lock("workflow", "id", "held-kid")) as held, running_engine("commit-engine"):
        weft.signal("held", "end", "done")  # its end closes its child: the child's row is held
        took = good_workflow_took()
        log = noisy(caplog.records, at_most=4)
        assert (took < 5, log) == (True, []), (took, log)
        wait_for(lambda: DEFERRED in caplog.text, 10, message="its commit deferred")  # the lock was met
        assert (_status("held"), _status("held-kid")) == ("running", "running") and not held.released.is_set()
        held.let_go()
        assert weft.get_handle("held").result(timeout=20) == "done"
    assert _status("held-kid") == "cancelled"
