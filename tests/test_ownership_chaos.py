"""Three engines, many ten-step workflows, and faults: SIGKILL, SIGSTOP past the TTL then SIGCONT,
and terminated database connections. Afterwards the invariants of ARCHITECTURE §3 are checked with
queries over the tables. Tests assert that takeovers happen and that nothing commits twice, not how fast
(timing is a benchmark)."""

from __future__ import annotations

import json
import time

import pytest
from django.db import connection
from django.db.models import Count, Max, Min

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import Step, Workflow, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess, pytest.mark.postgres]
FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}
WORKFLOWS = 100


def terminate_backends(engine_id: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            [f"weft-{engine_id}"],
        )
        return cursor.fetchone()[0]


def steps_done() -> int:
    return Step.objects.filter(status="completed").count()


def test_three_engines_under_faults_keep_every_invariant(weft_engines):
    handles = [weft.start("tests.chaos_ten", args=[f"c{i}", 0.02], id=f"chaos-{i}") for i in range(WORKFLOWS)]
    killed = weft_engines("chaos-killed", env=FAST)
    zombie = weft_engines("chaos-zombie", "-v", "2", env=FAST)
    cut = weft_engines("chaos-cut", env=FAST)
    total = WORKFLOWS * 10

    wait_for(lambda: steps_done() > total * 0.15, timeout=120, message="15% of steps")
    killed.kill()
    wait_for(lambda: steps_done() > total * 0.3, timeout=120, message="30% of steps")
    wait_for(
        lambda: WorkflowClaim.objects.filter(engine_id="chaos-zombie").exists(),
        timeout=60,
        message="the zombie-to-be to hold claims",
    )
    zombie.freeze()
    frozen_at = time.monotonic()
    assert terminate_backends("chaos-cut") >= 1
    wait_for(lambda: steps_done() > total * 0.5, timeout=120, message="50% of steps")
    time.sleep(max(0.0, 6.0 - (time.monotonic() - frozen_at)))  # past TTL + grace for sure
    zombie.thaw()
    assert terminate_backends("chaos-cut") >= 1
    survivor = weft_engines("chaos-late", env=FAST)

    for handle in handles:
        assert handle.result(timeout=180) == 10  # (I7) every run ends
    zombie.stop()
    cut.stop()
    survivor.stop()

    # (I1) exactly one Step per (run, seq), all completed, results from exactly those.
    per_run = Step.objects.values("run_id").annotate(n=Count("id"), lo=Min("seq"), hi=Max("seq"))
    assert len(per_run) == WORKFLOWS and all(r["n"] == 10 and r["lo"] == 0 and r["hi"] == 9 for r in per_run)
    assert not Step.objects.exclude(status="completed").exists()
    # (I2, I4) within a run, a later step never carries an older epoch than an earlier one, and the
    # claim's epoch is at least every step's epoch.
    for workflow_id in Workflow.objects.values_list("id", flat=True):
        epochs = list(Step.objects.filter(workflow_id=workflow_id).order_by("seq").values_list("epoch", flat=True))
        assert epochs == sorted(epochs), (workflow_id, epochs)
        assert WorkflowClaim.objects.get(workflow_id=workflow_id).epoch >= epochs[-1]
    # Every activity ran; none ran more often than its faults can explain (one re-run per takeover).
    counts = ActivityCall.objects.filter(name="chaos_step").values("key").annotate(n=Count("id"))
    assert len(counts) == total
    assert max(row["n"] for row in counts) <= 3
    # No claim is left held: every run is terminal and released its claim.
    assert not WorkflowClaim.objects.filter(engine_id__isnull=False).exists()
    # Takeovers happened, and the zombie's late writes were refused or discarded, never committed.
    takeover_epochs = Step.objects.values("workflow_id").annotate(n=Count("epoch", distinct=True)).filter(n__gt=1)
    assert takeover_epochs.exists()
    output = zombie.output()
    assert ("fenced commit refused" in output) or ("stopped driving" in output), output[-2000:]
