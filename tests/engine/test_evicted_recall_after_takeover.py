"""An evicted workflow recalled after its dormant claim was taken over (ADR 0014) must not be driven.

Engine A evicts a parked workflow (MAX_RESIDENT_WORKFLOWS 1) and keeps its claim dormant; A is frozen
(SIGSTOP) until its claims lapse, engine B takes them over, and B is frozen in turn (it still holds the
claims). A is thawed and a signal names the evicted workflow: the wake-up recalls it. The recall loaded
it at the epoch it was evicted at without reading its claim, so A, no longer its owner, delivered the
signal and ran the next step, a local activity with side effects in A's process, before its fenced
commit was refused. The local activity records which engine ran it and which held the claim then."""

from __future__ import annotations

from datetime import timedelta

import pytest

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import WorkflowClaim
from weft_django.store.clock import db_clock
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess, pytest.mark.postgres]
FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "MAX_RESIDENT_WORKFLOWS": 1}


def test_a_recalled_workflow_whose_dormant_claim_was_taken_over_is_not_driven(weft_engines):
    ids = [weft.start("tests.signal_then_local", id=f"rat-{n}").id for n in range(2)]
    first = weft_engines("rat-first", weft=FAST)

    def dormant() -> list[str]:
        far = db_clock("default") + timedelta(seconds=6)
        rows = WorkflowClaim.objects.filter(pk__in=ids, engine_id="rat-first", expires_at__gt=far)
        return list(rows.values_list("workflow_id", flat=True))

    [evicted] = wait_for(dormant, timeout=60, message="one evicted workflow with a dormant claim")
    frozen = first.freeze_past_claim()
    second = weft_engines("rat-second", weft={**FAST, "MAX_RESIDENT_WORKFLOWS": 10})
    frozen.wait_for_takeover()
    wait_for(lambda: set(second.claims()) == set(ids), timeout=30, message="the second engine holds both")
    second.freeze()  # it keeps the claims (their holder is alive for another TTL and grace)
    second._settle_in_flight_statements()

    frozen.thaw()
    weft.signal(evicted, "go", "payload")
    runs = wait_for(
        lambda: list(
            ActivityCall.objects.filter(name="local_who", key__startswith=f"{evicted}|").values_list("key", flat=True)
        ),
        timeout=60,
        message="the step after the signal to run",
    )
    second.thaw()
    wait_for(lambda: weft.get_handle(evicted).describe()["status"] == "completed", timeout=60, message="its end")
    runs = list(
        ActivityCall.objects.filter(name="local_who", key__startswith=f"{evicted}|").values_list("key", flat=True)
    )
    by_non_owner = [key for key in runs if key.split("|ran=")[1].split("|holder=")[0] != key.split("|holder=")[1]]
    assert by_non_owner == [], f"the step ran in an engine that did not hold the claim: {runs}"
