"""weft_engine as a real subprocess receiving real signals, on the test database."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from django.db.models import Count

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import Engine, Step, Workflow, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}


def completed_steps(workflow_id: str) -> int:
    return Step.objects.filter(workflow_id=workflow_id, status="completed").count()


def test_sigkill_at_every_step_boundary(weft_engines):
    steps = 4
    handle = weft.start("tests.slow", args=["kill", steps, 0.4], id="kill-every-boundary")
    committed_at_kill: dict[str, int] = {}  # key -> its call count when its step had committed
    for boundary in range(1, steps):
        engine = weft_engines(f"killed-{boundary}", env=FAST)
        wait_for(lambda b=boundary: completed_steps(handle.id) >= b, timeout=60, message=f"step {boundary}")
        engine.kill()
        engine.wait()
        for step in Step.objects.filter(workflow_id=handle.id, status="completed"):
            key = f"kill-{step.seq}"
            committed_at_kill.setdefault(key, ActivityCall.objects.filter(key=key).count())
    weft_engines("survivor", env=FAST)
    assert handle.result(timeout=90) == [f"kill-{i}" for i in range(steps)]
    counts = dict(ActivityCall.objects.filter(name="slow_step").values_list("key").annotate(n=Count("id")))
    assert set(counts) == {f"kill-{i}" for i in range(steps)}
    assert all(n <= 2 for n in counts.values()), counts
    # A step whose result committed before a kill never ran again.
    assert all(counts[key] == n for key, n in committed_at_kill.items()), (counts, committed_at_kill)
    assert Step.objects.filter(workflow_id=handle.id).count() == steps  # (I1) one row per (run, seq)


def test_sigterm_drains_and_releases(weft_engines):
    handle = weft.start("tests.slow", args=["drain", 1, 1.5], id="drain")
    engine = weft_engines("draining", env=FAST)
    wait_for(lambda: ActivityCall.objects.filter(key="drain-0").exists(), timeout=30, message="activity start")
    engine.terminate()
    assert engine.wait(timeout=20) == 0
    # The running activity was allowed to finish and its result committed before the exit.
    assert Step.objects.get(workflow_id="drain", seq=0).status == "completed"
    claim = WorkflowClaim.objects.get(workflow_id="drain")
    assert claim.engine_id is None
    assert Engine.objects.get(id="draining").stopped_at is not None
    weft_engines("after-drain", env=FAST)
    assert handle.result(timeout=30) == ["drain-0"]
    assert ActivityCall.objects.filter(key="drain-0").count() == 1


def test_second_signal_forces_exit(weft_engines):
    weft.start("tests.slow", args=["force", 1, 5], id="force")
    engine = weft_engines("forced", "--drain-timeout", "30", env=FAST)
    wait_for(lambda: ActivityCall.objects.filter(key="force-0").exists(), timeout=30, message="activity start")
    engine.send(signal.SIGINT)
    # Two signals sent before Python runs the handler would count as one: wait until it has run.
    wait_for(lambda: "draining engine=forced" in engine.output(), timeout=30, message="the first SIGINT handled")
    engine.send(signal.SIGINT)
    assert engine.wait(timeout=30) != 0


def test_two_engines_share_the_work_without_running_anything_twice(weft_engines):
    handles = [weft.start("tests.three_steps", args=[f"two-{i}"]) for i in range(40)]
    weft_engines("share-a", env=FAST)
    weft_engines("share-b", env=FAST)
    for handle in handles:
        handle.result(timeout=60)
    counts = ActivityCall.objects.filter(name="record_call").values("key").annotate(n=Count("id"))
    assert len(counts) == 120
    assert {row["n"] for row in counts} == {1}
    owners = set(Step.objects.values_list("epoch", flat=True))
    assert len(owners) >= 2


def test_bad_settings_exit_nonzero_and_write_nothing():
    from django.db import connection

    overrides = json.dumps({"WORKFLOW_CLAIM_TTL": "2s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "weft_django.testing",
            "--database-name",
            connection.settings_dict["NAME"],
            "--",
            "--engine-id",
            "bad",
        ],
        env={**__import__("os").environ, "WEFT_TEST_OVERRIDES": overrides},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert (
        "OWNERSHIP: 'workflow-lease' requires WORKFLOW_CLAIM_TTL (2000ms) to be at least "
        "WORKFLOW_CLAIM_TTL_SAFETY_MULTIPLIER (3) times WORKFLOW_CLAIM_RENEW_INTERVAL (1000ms)"
    ) in result.stderr
    assert not Engine.objects.exists()
    assert not Workflow.objects.exists()


def test_once_processes_runnable_work_and_exits(weft_engines):
    handle = weft.start("tests.sum", args=[1, 2])
    engine = weft_engines("once", "--once", env=FAST)
    assert engine.wait(timeout=60) == 0
    assert handle.result(timeout=5) == {"total": 3}
