"""Two processes under one engine id for a while: an engine still draining (its supervisor was killed
and started again, or an orchestrator started the new process before the old one ended) and its
successor, which registered the id again. The old process's shutdown recorded the id as stopped: the
live successor was shown stopped, `weft doctor` (the liveness probe) found no engine alive while it
drove workflows, and `--reset-ownership-mode` and DETECT_SECOND_INSTANCE no longer saw it (found by a
helper's review, rev6)."""

from __future__ import annotations

import json

import pytest

import weft_django as weft
from weft_django.admin.doctor import OK, doctor
from weft_django.models import Engine, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}


def test_an_old_process_stopping_leaves_its_successors_engine_row_alive(weft_engines):
    old = weft_engines("same-id", env=FAST)
    wait_for(lambda: Engine.objects.filter(id="same-id", pid=old.pid).exists(), timeout=30, message="old engine")
    new = weft_engines("same-id", env=FAST)
    wait_for(lambda: Engine.objects.filter(id="same-id", pid=new.pid).exists(), timeout=30, message="new engine")
    old.terminate()
    assert old.wait(timeout=30) == 0
    handle = weft.start("tests.signals", id="same-id-run")  # parked on its signal, held by the successor
    wait_for(lambda: WorkflowClaim.objects.filter(workflow_id=handle.id, engine_id="same-id").exists(), timeout=30)
    engines = next(f for f in doctor("default") if f.check == "engines")  # weft doctor, the liveness probe
    assert engines.level == OK, engines.summary
    row = Engine.objects.get(id="same-id")
    assert (row.pid, row.stopped_at) == (new.pid, None), "the live successor is recorded as stopped"
