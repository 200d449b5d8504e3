"""An update handler's changes are durable by replay: the applied update is recorded with the seq it
arrived at, and replay applies it again there, in arrival order, before that seq's recorded result is
fed. Here updates (one whose handler changed state and then raised) interleave with signal and
activity steps on an engine subprocess that is then SIGKILLed; the engine that takes the run over
replays it and must rebuild the same state, in the same order relative to the steps, and go on."""

from __future__ import annotations

import json

import pytest

import weft_django as weft
from weft_django.models import AppliedUpdate, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}


def holder(workflow_id: str) -> str | None:
    return WorkflowClaim.objects.filter(pk=workflow_id).values_list("engine_id", flat=True).first()


def test_a_takeover_replays_updates_in_their_place_among_the_steps(weft_engines):
    handle = weft.start("tests.update_order", kwargs={"rounds": 3}, id="update-order")
    victim = weft_engines("victim", env=FAST)
    wait_for(lambda: holder(handle.id) == "victim", timeout=30, message="the victim to claim the run")

    def log() -> list[str]:
        return handle.query("log", timeout="20s")

    assert handle.update("note", "1", timeout="20s") == 1
    handle.signal("next", "x")
    wait_for(lambda: len(log()) == 3, timeout=30, message="round 0")
    assert handle.update("note", "2", timeout="20s") == 4
    with pytest.raises(weft.UpdateFailedError):
        handle.update("broken", "3", timeout="20s")
    assert handle.update("note", "4", timeout="20s") == 6
    handle.signal("next", "y")
    wait_for(lambda: len(log()) == 8, timeout=30, message="round 1")
    assert handle.update("note", "5", timeout="20s") == 9
    live = ["u:1", "s0:x", "a0:1", "u:2", "b:3", "u:4", "s1:y", "a1:2", "u:5"]
    assert log() == live  # answered from durable state only (concepts.md): all of it is committed

    victim.kill()
    victim.wait()
    weft_engines("survivor", env=FAST)
    wait_for(lambda: holder(handle.id) == "survivor", timeout=60, message="the survivor to take the run over")
    assert log() == live, "the replay rebuilt another state than the live run had"
    assert list(AppliedUpdate.objects.filter(workflow_id=handle.id).order_by("seq", "n").values_list("seq", "n")) == [
        (0, 0),
        (2, 0),
        (2, 1),
        (2, 2),
        (4, 0),
    ]
    assert handle.update("note", "6", timeout="20s") == 10
    handle.signal("next", "z")
    assert handle.result(timeout=30) == [*live, "u:6", "s2:z", "a2:3"]
