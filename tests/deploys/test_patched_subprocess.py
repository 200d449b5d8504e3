"""ctx.patched across a real deploy: a run started by an engine on code v1 (tests/testapp/deploy_v1.py)
is parked on a signal, the engine is killed, an engine on v2 (deploy_v2.py, the first step changed
behind ctx.patched) takes it over: the old run replays its old branch, a new run takes the new one.
The deterministic helpers (ctx.uuid4, ctx.random, ctx.now) give the replayed run the values it drew
live."""

from __future__ import annotations

import json

import pytest

import weft_django as weft
from tests.testapp import deploy_v1  # noqa: F401 - registers "tests.deploy" (v1) for weft.start here
from tests.testapp.models import ActivityCall
from weft_django.models import Step
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}


def _parked(workflow_id: str) -> bool:
    return Step.objects.filter(workflow_id=workflow_id, kind="activity", status="completed").exists()


def test_a_run_recorded_on_v1_keeps_the_old_branch_after_a_deploy_of_v2(weft_engines):
    old = weft.start("tests.deploy", args=["old"], id="deploy-old")
    v1 = weft_engines("deploy-v1", env=FAST, weft={"AUTODISCOVER_MODULE": "deploy_v1"})
    wait_for(lambda: _parked(old.id), timeout=60, message="v1 ran the first step")
    v1.kill()
    v1.wait()

    weft_engines("deploy-v2", env=FAST, weft={"AUTODISCOVER_MODULE": "deploy_v2"})
    new = weft.start("tests.deploy", args=["new"], id="deploy-new")
    wait_for(lambda: _parked(new.id), timeout=60, message="v2 ran the new run's first step")
    old.signal("go", "o")
    new.signal("go", "n")
    old_result = old.result(timeout=60)
    new_result = new.result(timeout=60)

    assert old_result["done"].startswith("old:old|")
    assert new_result["done"].startswith("new:new|")
    assert list(Step.objects.filter(workflow_id=old.id).order_by("seq").values_list("kind", "name")) == [
        ("activity", "tests.deploy.old_step"),
        ("signal", "go"),
    ]
    assert list(Step.objects.filter(workflow_id=new.id).order_by("seq").values_list("kind", "name")) == [
        ("patch", "new-first-step"),
        ("activity", "tests.deploy.new_step"),
        ("signal", "go"),
    ]
    # The helpers' values the replayed run returns are the ones it drew live, before the kill (the
    # activity's argument), on another engine and another code version.
    live = ActivityCall.objects.get(name="deploy.old_step").key
    assert live == "old|" + "|".join(str(value) for value in old_result["seen"])
    assert ActivityCall.objects.filter(name="deploy.old_step").count() == 1
    # ctx.now() after the signal is the signal step's durable completion time.
    signal_step = Step.objects.get(workflow_id=old.id, kind="signal")
    assert old_result["after_signal"] == signal_step.completed_at.isoformat()
