"""An engine restarted under the same id after ``kill -9`` starts even while a user's open transaction
holds one of the claims its predecessor left.

At start-up the engine cuts its predecessor's dormant claims (ADR 0014) to one TTL, in one UPDATE that
waited for every row: a claim row a user's transaction held (SELECT ... FOR UPDATE around a cancel())
made it wait out the session's lock_timeout (half the TTL) and the engine failed to start."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

import weft_django as weft
from tests.engine.test_commit_locks import holding
from weft_django.models import Engine, WorkflowClaim
from weft_django.store.clock import db_clock
from weft_django.testing import wait_for

HOLD = "SELECT 1 FROM weft_django_workflowclaim WHERE workflow_id = %s FOR UPDATE"
pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]
FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "MAX_RESIDENT_WORKFLOWS": 1}


def test_a_restart_starts_while_a_user_holds_a_claim_row_of_its_predecessor(weft_engines):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    ids = [weft.start("tests.signals", id=f"rsh-{n}").id for n in range(3)]
    first = weft_engines("rsh-engine", weft=FAST)

    def dormant() -> list[str]:
        far = db_clock("default") + timedelta(seconds=6)
        rows = WorkflowClaim.objects.filter(pk__in=ids, engine_id="rsh-engine", expires_at__gt=far)
        return sorted(rows.values_list("workflow_id", flat=True))

    held = wait_for(lambda: dormant() if len(dormant()) == 2 else None, timeout=60, message="two dormant claims")
    first.kill()
    first.wait()
    with holding(HOLD, [held[0]], hold_at_most=40):
        again = weft_engines("rsh-engine", weft=FAST)
        wait_for(
            lambda: again.process.poll() is not None or _beating(again.pid),
            timeout=30,
            message="the restart",
        )
        assert again.process.poll() is None, f"the restarted engine exited: {again.output()[-1500:]}"
        cut = dormant()
    assert held[1] not in cut, f"the claim not held by the user kept its dormant expiry: {cut}"
    assert again.stop() == 0


def _beating(pid: int) -> bool:
    """The restarted process registered and its renewal thread wrote a heartbeat since."""
    row = Engine.objects.filter(pk="rsh-engine", pid=pid).first()
    return row is not None and row.heartbeat_at > row.started_at
