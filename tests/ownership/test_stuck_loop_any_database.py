"""The stuck loop's report on any database and Python (engine/stall.py reads another thread's frames:
``frame.f_locals`` is a snapshot dict up to Python 3.12 and a FrameLocalsProxy from 3.13): a real
engine stuck in a local step names that workflow and that call, keeps its claim, and ends the run
once the call returns; then the engine renews as before (its claims are held, its heartbeat written)."""

from __future__ import annotations

import os

import pytest

import weft_django as weft
from weft_django.models import Engine, WorkflowClaim
from weft_django.store.clock import db_clock
from weft_django.testing import wait_for

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "200ms"}


def test_a_stuck_local_step_is_named_and_its_workflow_kept(weft_engines, tmp_path) -> None:
    marker, release = str(tmp_path / "held"), str(tmp_path / "release")
    engine = weft_engines("sany-engine", weft=FAST)
    parked = weft.start("tests.signals", id="sany-parked")
    wait_for(lambda: WorkflowClaim.objects.filter(pk=parked.id, engine_id="sany-engine").exists(), timeout=60)
    stuck = weft.start("tests.stuck_until", args=[marker, release], id="sany-stuck")
    wait_for(lambda: os.path.exists(marker), timeout=60, message="the loop stuck")
    wait_for(lambda: "engine loop stuck" in engine.output(), timeout=60, message="the report")
    line = engine.output().split("engine loop stuck", 1)[1].split("\n", 1)[0]
    assert "engine=sany-engine" in line and "workflow=sany-stuck " in line and "(hold_until)" in line, line
    assert WorkflowClaim.objects.get(pk=stuck.id).engine_id == "sany-engine"
    open(release, "w").close()
    assert stuck.result(timeout=60) == "held the loop"
    parked.signal("go", "here")
    assert parked.result(timeout=60) == "here"  # no peer: its lapsed claim was renewed again
    after = db_clock()
    wait_for(lambda: Engine.objects.get(pk="sany-engine").heartbeat_at > after, timeout=30, message="a heartbeat")
    engine.stop()
