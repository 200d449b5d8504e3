"""A loop stuck in one pass (a local step that does not return: Python cannot interrupt it) hands its
engine's other workflows over to other engines, and keeps the one it is stuck in.

Before, claim renewal (a thread of its own) went on renewing every claim the engine held while its
loop was stuck: the engine looked alive to its peers, and a workflow it held waited for as long as the
loop did (here a signalled workflow never finished while another's local step ran for minutes).
Now renewal stops renewing them once the loop has been inside one call for twice the claim TTL
(engine/stall.py): they lapse and a peer takes them over, as from a frozen engine; the stuck
workflow's own claim stays renewed, so it does not stall the next engine too.
"""

from __future__ import annotations

import os

import pytest

import weft_django as weft
from weft_django.models import WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "200ms"}


def _holder(workflow_id: str) -> str | None:
    return WorkflowClaim.objects.filter(pk=workflow_id).values_list("engine_id", flat=True).first()


def _last_holder(workflow_id: str) -> str | None:
    return WorkflowClaim.objects.filter(pk=workflow_id).values_list("last_engine_id", flat=True).first()


def test_a_stuck_loop_hands_its_other_workflows_over_and_keeps_the_stuck_one(weft_engines, tmp_path) -> None:
    marker = str(tmp_path / "held")
    parked = weft.start("tests.signals", id="stuck-parked")
    first = weft_engines("stuck-first", weft=FAST)
    wait_for(lambda: _holder(parked.id) == "stuck-first", timeout=60, message="the first engine holds the parked one")
    stuck = weft.start("tests.stuck_loop", args=[marker, 600.0], id="stuck-held")
    wait_for(lambda: os.path.exists(marker), timeout=60, message="the local step holding the first engine's loop")
    second = weft_engines("stuck-second", weft=FAST)
    parked.signal("go", "moved")
    assert parked.result(timeout=60) == "moved", first.output()[-3000:]
    assert _last_holder(parked.id) == "stuck-second", "a peer took the parked one over and ended it"
    assert _holder(stuck.id) == "stuck-first", "the stuck workflow stays with the engine stuck in it"
    assert stuck.describe()["status"] == "running"
    log = first.output()
    assert "engine loop stuck engine=stuck-first" in log and "workflow=stuck-held" in log, log[-3000:]
    assert "hold_the_loop" in log.split("engine loop stuck", 1)[1].split("\n", 1)[0]
    first.kill()
    second.stop()
