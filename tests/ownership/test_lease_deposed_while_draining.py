"""OWNERSHIP="lease": a holder deposed during its shutdown drain commits nothing more.

The drain (SIGTERM: running activities finish, their results are committed) passes no lease check:
the loop acts on a lost lease only where it claims, which a drain does not. Here the holder stalls
(SIGSTOP) in its drain past the lease's TTL and grace, a standby takes the lease and every claim at
once, and the holder, thawed, finishes its activity: the per-workflow fence (the claim's holder and
epoch, which every mode keeps: ADR 0008) refuses its result. The step is committed once, by the new
owner, at its epoch."""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import Step, StoreLease, WorkflowClaim
from weft_django.testing import wait_for

# PostgreSQL: on SQLite a holder frozen inside a write would keep the one write lock from the standby.
pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s"}


def test_a_holder_deposed_during_its_drain_commits_nothing(weft_engines):
    holder = weft_engines("ldd-holder", "-v", "2", "--drain-timeout", "60", weft=LEASE)
    wait_for(lambda: StoreLease.objects.filter(engine_id="ldd-holder").exists(), timeout=30, message="the lease")
    standby = weft_engines("ldd-standby", weft={**LEASE, "LEASE_WAIT_TIMEOUT": "60s"})
    handle = weft.start("tests.slow", args=["ldd", 1, 4.0], id="ldd")
    wait_for(lambda: ActivityCall.objects.filter(key="ldd-0").exists(), timeout=30, message="the holder's attempt")
    held_at = WorkflowClaim.objects.get(pk="ldd").epoch
    holder.terminate()
    wait_for(lambda: "draining engine=ldd-holder" in holder.output(), timeout=10, message="the drain")
    holder.freeze()  # its activity still running: the drain waits for it
    wait_for(
        lambda: WorkflowClaim.objects.filter(pk="ldd", engine_id="ldd-standby").exists(),
        timeout=30,
        message="the standby to take the lease and the claim",
    )
    holder.thaw()  # the attempt ends; the drain tries to commit its result
    assert holder.wait(30) == 0, holder.output()[-3000:]
    assert "stopped driving workflow=ldd engine=ldd-holder" in holder.output(), holder.output()[-3000:]
    assert handle.result(timeout=30) == ["ldd-0"]
    taken_at = WorkflowClaim.objects.get(pk="ldd").epoch
    steps = list(Step.objects.filter(workflow_id="ldd").values_list("seq", "epoch"))
    assert len(steps) == 1 and steps[0][1] == taken_at != held_at, (
        f"steps {steps}: the holder's epoch {held_at}, the standby's {taken_at}\n{holder.output()[-3000:]}"
    )
    assert standby.stop() == 0
