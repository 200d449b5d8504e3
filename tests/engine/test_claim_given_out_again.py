"""A workflow this engine drives whose claim went away unseen (a cancel-then-retry, a suspend-then-resume
whose wake-ups were missed, or SQLite, which sends none) and that its own acquire then takes again: the
old context and whatever it wrote in the pass are stale. Before the fix the old context's writes (fenced
at its old epoch) were committed together with the new context's, the fence refused them all, the new
context was dropped, and the workflow waited for its own claim to expire (about 40 s at defaults). Found
by a review of the session-17 acquire change."""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.models import Step, Workflow, WorkflowClaim

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_workflow_taken_again_by_its_own_engine_is_driven_by_the_new_context_only():
    handle = weft.start("tests.signals", id="given-out-again")
    engine = Engine("given-out-again-engine")
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].armed, "the signal wait")
        old = engine.owned[handle.id]
        # The claim goes back to unheld behind the engine's back, with no wake-up (as a transition
        # whose NOTIFY was missed leaves it); the run is claimable again.
        WorkflowClaim.objects.filter(workflow_id=handle.id).update(engine_id=None, claimed_at=None, expires_at=None)
        handle.signal("go", "delivered once")
        engine.claimer.last_claim_scan = 0.0  # the pass that serves the signal also scans for claims
        engine.tick()
        owned = engine.owned.get(handle.id)
        if Workflow.objects.get(id=handle.id).status == "running":
            assert owned is not None and owned is not old, "the re-acquired workflow was dropped"
            assert owned.epoch > old.epoch
            tick_until(engine, lambda: Workflow.objects.get(id=handle.id).status != "running", "its end")
    finally:
        engine.shutdown()
    assert handle.result(timeout=5) == "delivered once"
    assert Workflow.objects.get(id=handle.id).status == "completed"
    assert Step.objects.filter(workflow_id=handle.id).count() == 1
