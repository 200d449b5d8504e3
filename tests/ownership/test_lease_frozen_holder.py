"""OWNERSHIP="lease": the lease holder frozen (SIGSTOP) past the lease's TTL and grace. A standby takes the
lease and every claim at once; the thawed holder finds the lease lost at its next renewal, stops driving
every workflow (``store lease lost ... deposed for every workflow``), does not take the lease back while
the new holder renews it, and nothing it finished is committed under its old epochs."""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import Step, StoreLease, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s"}


def test_a_frozen_lease_holder_is_deposed_for_every_workflow_and_its_late_result_refused(weft_engines):
    handle = weft.start("tests.slow", args=["lfz", 2, 2.5], id="lfz")
    first = weft_engines("lfz-first", "-v", "2", weft=LEASE)
    wait_for(lambda: ActivityCall.objects.filter(key="lfz-0").exists(), timeout=30, message="the first attempt")
    lease_epoch = StoreLease.objects.get().epoch
    frozen = first.freeze_past_claim()  # the lease has the same TTL and grace as the claim
    standby = weft_engines("lfz-standby", "-v", "2", weft={**LEASE, "LEASE_WAIT_TIMEOUT": "60s"})
    assert frozen.wait_for_takeover() == {"lfz": "lfz-standby"}
    assert StoreLease.objects.get().engine_id == "lfz-standby"
    assert handle.result(timeout=60) == ["lfz-0", "lfz-1"]
    refused = frozen.assert_writes_refused(stop=False)
    wait_for(lambda: "store lease lost engine=lfz-first" in first.output(), timeout=15, message="the lease lost")
    lease = StoreLease.objects.get()
    assert lease.engine_id == "lfz-standby" and lease.epoch > lease_epoch, "the thawed engine took the lease back"
    assert first.stop() == 0 and standby.stop() == 0
    assert refused == {"lfz"} or "lfz" in frozen.refusals(), first.output()[-3000:]
    steps = list(Step.objects.filter(workflow_id="lfz").values_list("seq", "epoch"))
    assert len(steps) == 2 and {epoch for _, epoch in steps} == {WorkflowClaim.objects.get(pk="lfz").epoch}
