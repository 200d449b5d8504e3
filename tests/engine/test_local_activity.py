"""Local activities (``local=True``, issue 16) and the outcome carried by the R: wake-up, with the
engine as a real subprocess on the test database."""

from __future__ import annotations

import json
import time

import pytest
from django.db.models import Count

import weft_django as weft
from tests.testapp.models import ActivityCall
from tests.testapp.workflows import local_step
from weft_django.exceptions import WorkflowDefinitionError
from weft_django.models import Step, Timer, WorkflowClaim
from weft_django.registry import registry
from weft_django.store import notify
from weft_django.testing import wait_for

FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}


def calls(name: str) -> dict[str, int]:
    return dict(ActivityCall.objects.filter(name=name).values_list("key").annotate(n=Count("id")))


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_local_steps_commit_with_the_end(weft_engines):
    weft_engines("local-a", env=FAST)
    handle = weft.start("tests.local_steps", args=["l", 3], id="local-three")
    assert handle.result(timeout=30) == ["l-0", "l-1", "l-2"]
    rows = list(Step.objects.filter(workflow_id="local-three").order_by("seq").values_list("seq", "status", "attempts"))
    assert rows == [(0, "completed", 1), (1, "completed", 1), (2, "completed", 1)]
    assert calls("local_step") == {"l-0": 1, "l-1": 1, "l-2": 1}


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_local_step_is_durable_before_the_workflow_parks(weft_engines):
    weft_engines("local-b", env=FAST)
    handle = weft.start("tests.local_then_signal", args=["p"], id="local-park")
    wait_for(lambda: Step.objects.filter(workflow_id="local-park", seq=0, status="completed").exists(), timeout=30)
    handle.signal("go", 7)
    assert handle.result(timeout=30) == ["p-0", 7, "p-1"]
    assert calls("local_step") == {"p-0": 1}


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_local_activity_runs_again_after_a_kill_at_least_once(weft_engines):
    """Killed while the second local step runs: nothing of it (nor of the first, not committed yet)
    is durable, so the next engine runs both again; the workflow still completes once."""
    handle = weft.start("tests.local_steps", args=["k", 2, 1.5], id="local-kill")
    engine = weft_engines("local-killed", env=FAST)
    wait_for(lambda: ActivityCall.objects.filter(name="local_step", key="k-1").exists(), timeout=30)
    engine.kill()
    engine.wait()
    assert not Step.objects.filter(workflow_id="local-kill").exists()  # no attempt record before dispatch
    weft_engines("local-survivor", env=FAST)
    assert handle.result(timeout=60) == ["k-0", "k-1"]
    assert calls("local_step") == {"k-0": 2, "k-1": 2}
    assert Step.objects.filter(workflow_id="local-kill").count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_local_activity_retries_are_recorded(weft_engines):
    weft_engines("local-c", env=FAST)
    handle = weft.start("tests.local_flaky", args=["f", 2], id="local-flaky")
    assert handle.result(timeout=30) == 3
    step = Step.objects.get(workflow_id="local-flaky", seq=0)
    assert (step.status, step.attempts) == ("completed", 3)
    assert not Timer.objects.filter(workflow_id="local-flaky").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_result_over_the_notify_limit_is_read(weft_engines):
    weft_engines("local-d", env=FAST)
    small = weft.start("tests.big_result", args=[10], id="result-small")
    big = weft.start("tests.big_result", args=[20_000], id="result-big")
    assert small.result(timeout=30) == "big" + "x" * 10
    assert big.result(timeout=30) == "big" + "x" * 20_000


def test_ended_payload_round_trips_and_falls_back():
    payload = notify.ended_payload("wf-1", "completed", '"value"', None, "5f0e0c7e-0000-0000-0000-000000000000")
    assert payload.startswith("R:")
    workflow_id, row = notify.parse_ended(payload[2:])
    assert workflow_id == "wf-1"
    assert row["status"] == "completed" and row["result"] == '"value"' and row["run_id"].startswith("5f0e")
    big = notify.ended_payload("wf-1", "completed", '"' + "x" * 9000 + '"', None, "r")
    assert big == "r:wf-1"
    assert notify.ended_payload("wf-1", "timed_out", None, {"type": "T"}, "r") == "r:wf-1"
    assert notify.parse_ended("not json") is None


def test_local_option_is_checked():
    with pytest.raises(WorkflowDefinitionError, match="local=True cannot be combined with atomic=True"):
        weft.activity(name="tests.bad_local", local=True, atomic=True)(lambda: None)
    with pytest.raises(WorkflowDefinitionError, match='executor="celery"'):
        local_step.options(executor="celery")
    with pytest.raises(WorkflowDefinitionError, match="local must be True or False"):
        local_step.options(local="yes")
    assert local_step.options(local=False).local is False
    assert "tests.bad_local" not in registry.activities  # nothing registered


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_evicted_parked_workflows_resume_by_replay(weft_engines):
    """MAX_RESIDENT_WORKFLOWS=2 and six parked workflows: four are evicted (claims still held and
    renewed); a signal to each loads it again and replays it: its durable step does not run again."""
    env = {
        "WEFT_TEST_OVERRIDES": json.dumps(
            {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "MAX_RESIDENT_WORKFLOWS": 2}
        )
    }
    engine = weft_engines("resident-2", "-v", "2", env=env)
    handles = [weft.start("tests.local_then_signal", args=[f"e{i}"], id=f"evict-{i}") for i in range(6)]
    for h in handles:
        wait_for(lambda h=h: Step.objects.filter(workflow_id=h.id, seq=0, status="completed").exists(), timeout=30)
    wait_for(lambda: "evicted idle parked workflows" in engine.output(), timeout=30, message="an eviction")
    time.sleep(4)  # past the claim TTL: the evicted claims were renewed, not lost
    assert WorkflowClaim.objects.filter(workflow_id__startswith="evict-", engine_id="resident-2").count() == 6
    for i, h in enumerate(handles):
        h.signal("go", i)
        assert h.result(timeout=30) == [f"e{i}-0", i, f"e{i}-1"]
    assert calls("local_step") == {f"e{i}-0": 1 for i in range(6)}
    assert "stopped driving" not in engine.output()
