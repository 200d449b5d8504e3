"""Local activities run on the engine's loop and become durable with the workflow's next fenced commit.
A run cancelled from outside while its local steps run (the cancel commits in the middle of the engine
pass that then records the rest of the local steps, an attribute and the run's end) keeps its cancel:
the pass's commit is fenced by the claim's epoch, which the cancel moved, so none of those writes
lands after the terminal state, and the cancel is not overwritten by the run's own end. Real engine
subprocess; the local activity waits on the loop until it reads the cancel. On PostgreSQL the pass's
commit is the one fenced statement (steps and end) or the general path (an attribute set too)."""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import Step, Workflow, WorkflowAttribute, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


@pytest.mark.parametrize("attributes", [False, True], ids=["steps-and-end", "with-an-attribute"])
def test_a_cancel_during_local_steps_is_kept_and_nothing_of_the_pass_lands_after_it(weft_engines, attributes):
    engine = weft_engines("local-cancel")
    handle = weft.start("tests.local_steps_cancelled", args=["lc", attributes], id="local-cancel")
    wait_for(
        lambda: ActivityCall.objects.filter(name="local_until_cancelled", key="lc").exists(),
        timeout=30,
        message="the local step to run on the engine's loop",
    )
    claim_before = WorkflowClaim.objects.get(pk=handle.id)
    handle.cancel("stop")  # commits while the engine's pass is inside the local step
    wait_for(
        lambda: ActivityCall.objects.filter(name="local_mark", key="lc:after").exists(),
        timeout=30,
        message="the pass to go on past the cancel (the next local step)",
    )
    wait_for(
        lambda: f"fenced commit refused workflow={handle.id}" in engine.output(),
        timeout=30,
        message="the pass's commit to be refused",
    )
    row = Workflow.objects.get(pk=handle.id)
    assert (row.status, row.cancel_reason, row.result, row.error) == ("cancelled", "stop", None, None)
    assert list(Step.objects.filter(workflow_id=handle.id)) == [], "a local step landed after the cancel"
    assert not WorkflowAttribute.objects.filter(workflow_id=handle.id).exists()
    claim = WorkflowClaim.objects.get(pk=handle.id)
    assert claim.epoch > claim_before.epoch and claim.engine_id is None and not claim.runnable
    # Its side effects did run: local activities are at-least-once, and a deposed engine's in-flight
    # pass may overlap the cancel (concepts.md, Ownership); only its durable writes are refused.
    assert ActivityCall.objects.filter(name="local_mark").count() == 2
    assert handle.status == "cancelled"
