"""Claims an engine holds must always be driven, renewed or released: a claim held by a live engine
that drives nothing waits out its TTL, the takeover grace and a takeover scan (40-100 s at defaults).
Three ways found by a helper's review (session 17), each seen failing before its fix:

- a loss reported for a workflow's old epoch deposed the context claimed again at a new epoch;
- claims acquired in a pass whose load then failed with a database error were forgotten;
- a workflow waiting to be loaded again (a recall, a failed pass) was not released at shutdown.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import DatabaseError
from django.test import override_settings
from django.utils import timezone

import weft_django as weft
from tests.engine.test_carried_signals import carried_once
from tests.engine.ticking import tick_until
from weft_django.codec import encode_payload
from weft_django.engine.engine import Engine
from weft_django.models import PendingUpdate, Workflow, WorkflowClaim

pytestmark = pytest.mark.django_db(transaction=True)


def _holder(wid: str) -> tuple[str | None, int]:
    claim = WorkflowClaim.objects.get(workflow_id=wid)
    return claim.engine_id, claim.epoch


def test_a_loss_found_for_the_old_epoch_does_not_depose_the_workflow_claimed_again() -> None:
    handle = weft.start("tests.msg_counter", args=[1], id="stranded-lost")
    engine = Engine("stranded-lost-engine")
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].armed, "its wait")
        old_epoch = engine.owned[handle.id].epoch
        # The claim goes back to unheld unseen; an admitted update makes the pass settle it first (its
        # fence finds the claim gone: a loss for the old epoch), then the pass's claim scan takes it again.
        WorkflowClaim.objects.filter(workflow_id=handle.id).update(engine_id=None, claimed_at=None, expires_at=None)
        run_id = Workflow.objects.get(pk=handle.id).run_id
        PendingUpdate.objects.create(
            id=uuid.uuid4(),
            workflow_id=handle.id,
            run_id=run_id,
            name="add",
            payload=encode_payload(1),
            created_at=timezone.now(),
        )
        engine.wake.look_at(handle.id)
        engine.claimer.last_claim_scan = 0.0
        engine.tick()
        assert engine.owned[handle.id].epoch > old_epoch
        for _ in range(3):
            engine.tick()
        assert handle.id in engine.owned, "the loss of the old epoch deposed the workflow claimed again"
        assert _holder(handle.id) == (engine.engine_id, engine.owned[handle.id].epoch)
        tick_until(engine, lambda: PendingUpdate.objects.get(workflow_id=handle.id).status == "completed", "the update")
    finally:
        engine.shutdown()


def test_claims_acquired_in_a_pass_whose_load_fails_are_loaded_on_a_later_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle = weft.start("tests.signals", id="stranded-load")
    engine = Engine("stranded-load-engine")
    real, calls = engine.loader.load, []

    def fails_once(*args: Any, **kwargs: Any) -> None:
        calls.append(sorted(args[0]))
        if len(calls) == 1:
            raise DatabaseError("the connection dropped mid-load")
        real(*args, **kwargs)

    monkeypatch.setattr(engine.loader, "load", fails_once)
    engine.start()
    try:
        tick_until(engine, lambda: len(calls) >= 1, "the first load")
        assert _holder(handle.id)[0] == engine.engine_id  # the acquire committed before the load failed
        tick_until(engine, lambda: handle.id in engine.owned, "a load on a later pass", timeout=5)
        handle.signal("go", "loaded")
        tick_until(engine, lambda: Workflow.objects.get(pk=handle.id).status == "completed", "its end")
    finally:
        engine.shutdown()
    assert handle.result(timeout=5) == "loaded"


@override_settings(WEFT={"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1})
def test_a_workflow_waiting_to_be_loaded_again_is_released_at_shutdown() -> None:
    for n in range(2):
        weft.start(carried_once, id=f"stranded-stop-{n}")
    engine = Engine("stranded-stop-engine", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: len(engine.residency.evicted) == 1, "one evicted")
        [wid] = engine.residency.evicted
        engine.wake.look_at(wid)  # mail for it: recalled, to be loaded by a pass that may claim
        engine.tick(claim=False)  # a draining pass does not
        assert wid in engine._reload
    finally:
        engine.shutdown()
    assert _holder(wid)[0] is None, "a stopped engine kept the claim of a workflow waiting to be loaded"
