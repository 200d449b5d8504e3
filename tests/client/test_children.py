"""Child workflows: results, failures, parent-close policies, nesting, and children on other engines."""

from __future__ import annotations

import json

import pytest
from django.db.models.functions import Coalesce

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import Workflow, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}


def test_parent_waits_for_its_children(weft_run_until_idle):
    handle = weft.start("tests.parent", args=["kids", 3], id="parent")
    weft_run_until_idle()
    assert handle.result(timeout=5) == ["kids-0", "kids-1", "kids-2"]
    children = Workflow.objects.filter(parent_id="parent").order_by("id")
    assert [c.id for c in children] == ["parent/1", "parent/2", "parent/3"]  # default id f"{parent}/{seq}"
    assert {c.status for c in children} == {"completed"}


def test_a_failed_child_raises_child_workflow_error(weft_run_until_idle):
    handle = weft.start("tests.parent_of_failure", args=["bad"])
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"child_id": "bad-kid", "status": "failed", "type": "ActivityError"}


@pytest.mark.parametrize(("policy", "child_status"), [("terminate", "cancelled"), ("abandon", "running")])
def test_parent_close_policy(weft_run_until_idle, policy, child_status):
    handle = weft.start("tests.parent_waits_forever", args=[policy], id=f"p-{policy}")
    weft_run_until_idle()
    assert Workflow.objects.get(id=f"p-{policy}-kid").status == "running"
    handle.cancel()
    assert Workflow.objects.get(id=f"p-{policy}-kid").status == child_status


def test_nesting_depth_is_limited(weft_run_until_idle):
    ok = weft.start("tests.nested", args=[3])
    weft_run_until_idle()
    assert ok.result(timeout=5) == 3
    too_deep = weft.start("tests.nested", args=[12])
    weft_run_until_idle()
    with pytest.raises(weft.WorkflowFailedError) as info:
        too_deep.result(timeout=5)
    assert "nest at most 10 deep" in info.value.error["message"]


@pytest.mark.subprocess
def test_children_on_other_engines_wake_their_parent_even_when_that_engine_dies(weft_engines):
    handle = weft.start("tests.parent", args=["far", 4, 1.5], id="far-parent")
    first = weft_engines("kids-a", env=FAST)
    second = weft_engines("kids-b", env=FAST)
    engines = {"kids-a": first, "kids-b": second}

    def holders():
        # The holder, or the last one: on a loaded machine a child may end (and release) before the
        # last one is claimed.
        rows = dict(
            WorkflowClaim.objects.filter(workflow_id__startswith="far-parent")
            .annotate(held_by=Coalesce("engine_id", "last_engine_id"))
            .values_list("workflow_id", "held_by")
        )
        return rows if len(rows) == 5 and all(rows.values()) else None

    claims = wait_for(holders, timeout=30, message="parent and children claimed")
    parent_engine = claims.pop("far-parent")
    elsewhere = [engine for engine in claims.values() if engine != parent_engine]
    victim = elsewhere[0] if elsewhere else parent_engine  # a child's engine, when one differs
    wait_for(lambda: ActivityCall.objects.filter(name="slow_step", key__startswith="far-").count() >= 4, timeout=30)
    engines[victim].kill()
    weft_engines("kids-c", env=FAST)
    assert handle.result(timeout=90) == ["far-0", "far-1", "far-2", "far-3"]
