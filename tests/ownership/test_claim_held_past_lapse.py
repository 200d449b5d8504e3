"""A claim row a user's transaction holds for longer than the TTL and the grace is not renewed (renewal
skips a held row), so once the lock goes a peer may take the claim from its live holder. The fence
keeps the holder's writes out; this checks the rest of WEFT's rule for a lost claim: the live holder
stops driving the workflow at its next renewal (WARNING ``stopped driving workflow=... reason=claim
lost``), its in-flight attempt's late result is not recorded, and the new owner finishes the run."""

from __future__ import annotations

import time

import pytest
from django.db import connection

import weft_django as weft
from tests.engine.test_commit_locks import holding
from tests.testapp.models import ActivityCall
from weft_django.models import Step, WorkflowClaim
from weft_django.testing import wait_for

HOLD = "SELECT 1 FROM weft_django_workflowclaim WHERE workflow_id = %s FOR UPDATE"
pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"}


def test_a_live_holder_whose_held_claim_was_taken_over_stops_driving_it(weft_engines):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    handle = weft.start("tests.slow", args=["chl", 1, 12.0], id="chl")
    first = weft_engines("chl-first", weft=FAST)
    wait_for(lambda: ActivityCall.objects.filter(name="slow_step").exists(), timeout=60, message="the attempt")
    second = weft_engines("chl-second", weft=FAST)
    with holding(HOLD, ["chl"], hold_at_most=40):
        time.sleep(7)  # TTL 3 s + grace 2 s, and more: the claim's expiry is past the grace
        first.freeze()  # its renewal loses the race for the row once the lock goes
        first._settle_in_flight_statements()
    wait_for(
        lambda: WorkflowClaim.objects.filter(pk="chl", engine_id="chl-second").exists(),  # not renewed: expired
        timeout=30,
        message="the peer takes the claim over",
    )
    first.thaw()
    wait_for(
        lambda: "stopped driving workflow=chl engine=chl-first" in first.output(),
        timeout=15,
        message=f"the live holder to stop driving it: {first.output()[-2000:]}",
    )
    assert handle.result(timeout=60) == ["chl-0"]
    assert "claim lost" in first.output().split("stopped driving workflow=chl engine=chl-first", 1)[1].split("\n")[0]
    epoch = WorkflowClaim.objects.get(pk="chl").epoch
    assert list(Step.objects.filter(workflow_id="chl").values_list("epoch", flat=True)) == [epoch]  # the new owner's
    assert second.stop() == 0 and first.stop() == 0
