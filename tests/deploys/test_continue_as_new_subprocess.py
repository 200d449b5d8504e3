"""ctx.continue_as_new across real engine subprocesses: a chain of runs driven by one engine, the
engine killed mid-chain, another engine finishing it; signals sent while runs continue are never
lost; the fence: the claim's epoch moves on with each new run."""

from __future__ import annotations

import json

import pytest

import weft_django as weft
from tests.deploys.test_continue_as_new import _chain
from weft_django.models import BufferedSignal, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
CHAIN = {"AUTODISCOVER_MODULE": "deploy_chain"}
FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}


def test_a_chain_survives_a_kill_and_loses_no_signal(weft_engines):
    handle = weft.start("tests.deploys.counter", args=[0, 0], id="cn-sub")
    epochs = [WorkflowClaim.objects.get(workflow_id=handle.id).epoch]
    first = weft_engines("cn-a", env=FAST, weft=CHAIN)
    handle.signal("add", 1)
    wait_for(lambda: len(_chain(handle.id)) == 1, timeout=60, message="run 0 continued as new")
    first.kill()
    first.wait()
    handle.signal("add", 2)  # sent while no engine runs: buffered for the new run
    weft_engines("cn-b", env=FAST, weft=CHAIN)
    wait_for(lambda: len(_chain(handle.id)) == 2, timeout=60, message="run 1 continued as new")
    epochs.append(WorkflowClaim.objects.get(workflow_id=handle.id).epoch)
    handle.signal("add", 3)
    assert handle.result(timeout=60) == {"runs": 3, "total": 6}
    assert epochs[1] > epochs[0]
    assert not BufferedSignal.objects.filter(workflow_id=handle.id, state="dropped").exists()
    assert BufferedSignal.objects.filter(workflow_id=handle.id, state="consumed").count() == 3
