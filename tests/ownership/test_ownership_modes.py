"""OWNERSHIP = "lease" (one store-wide lease) and "none" (a single engine), with real engine processes."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

import weft_django as weft
from weft_django.models import StoreLease, WorkflowClaim
from weft_django.store.clock import db_clock
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def env(**weft_settings: object) -> dict[str, str]:
    return {"WEFT_TEST_OVERRIDES": json.dumps(weft_settings)}


LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s"}


def test_lease_mode_admits_one_engine_and_a_waiting_one_takes_over_after_a_crash(weft_engines):
    handle = weft.start("tests.signals", id="leased")
    first = weft_engines("lease-a", env=env(**LEASE))
    wait_for(lambda: WorkflowClaim.objects.filter(workflow_id="leased", engine_id="lease-a").exists(), timeout=30)
    assert StoreLease.objects.get().engine_id == "lease-a"

    impatient = weft_engines("lease-b", env=env(**LEASE, LEASE_WAIT_TIMEOUT="1s"))
    assert impatient.wait(timeout=30) != 0
    assert "could not acquire the store-wide lease" in impatient.output()

    patient = weft_engines("lease-c", env=env(**LEASE, LEASE_WAIT_TIMEOUT="60s"))
    first.kill()
    first.wait()
    wait_for(lambda: StoreLease.objects.get().engine_id == "lease-c", timeout=30, message="lease handover")
    # The lease holder takes the dead engine's claims at once (its own lease proves they are stale).
    wait_for(lambda: WorkflowClaim.objects.filter(workflow_id="leased", engine_id="lease-c").exists(), timeout=30)
    handle.signal("go", "after handover")
    assert handle.result(timeout=30) == "after handover"
    assert patient.stop() == 0
    assert StoreLease.objects.get().engine_id is None  # released at shutdown


def test_none_mode_takes_over_its_predecessors_claims_at_start(weft_engines):
    handle = weft.start("tests.signals", id="single")
    first = weft_engines("single-a", env=env(OWNERSHIP="none"))
    wait_for(lambda: WorkflowClaim.objects.filter(workflow_id="single", engine_id="single-a").exists(), timeout=30)
    first.kill()
    first.wait()
    # The dead engine's claim is made valid for an hour: a takeover now can only be the start-up takeover.
    WorkflowClaim.objects.filter(workflow_id="single").update(expires_at=db_clock() + timedelta(hours=1))
    weft_engines("single-b", env=env(OWNERSHIP="none"))
    wait_for(lambda: WorkflowClaim.objects.filter(workflow_id="single", engine_id="single-b").exists(), timeout=60)
    handle.signal("go", 1)
    assert handle.result(timeout=30) == 1


def test_detect_second_instance_warns(weft_engines):
    settings = env(
        OWNERSHIP="none", DETECT_SECOND_INSTANCE=True, WORKFLOW_CLAIM_TTL="3s", WORKFLOW_CLAIM_RENEW_INTERVAL="1s"
    )
    first = weft_engines("solo-a", env=settings)
    second = weft_engines("solo-b", env=settings)
    wait_for(lambda: "second engine instance detected" in first.output() + second.output(), timeout=30)
