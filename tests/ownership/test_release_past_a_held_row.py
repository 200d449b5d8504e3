"""Shutdown releases every claim it can, even when a user's open transaction holds one claim row.

The release at shutdown updated the claims one statement each, in one transaction. Meeting a row a
user's transaction holds (SELECT ... FOR UPDATE around a cancel()), it waited out the engine session's
lock_timeout (half the TTL, 15 s by default), the whole transaction rolled back, and ALL the engine's
claims were left to expire (TTL + grace before a peer may take them), its engine row never marked
stopped and, in "lease" mode, the store lease kept. Only the held claim need wait for its expiry."""

from __future__ import annotations

import pytest
from django.db import connection

import weft_django as weft
from tests.engine.test_commit_locks import holding
from weft_django.models import Engine, WorkflowClaim
from weft_django.testing import wait_for

HOLD = "SELECT 1 FROM weft_django_workflowclaim WHERE workflow_id = %s FOR UPDATE"
pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"}


def test_a_claim_row_held_by_a_user_does_not_keep_the_others_at_shutdown(weft_engines):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    ids = [weft.start("tests.signals", id=f"rph-{n}").id for n in range(3)]
    engine = weft_engines("rph-engine", weft=FAST)
    wait_for(lambda: set(engine.claims()) == set(ids), timeout=60, message="the engine holds the three claims")
    with holding(HOLD, [ids[1]], hold_at_most=40):
        assert engine.stop() == 0, engine.output()
        holders = dict(WorkflowClaim.objects.filter(pk__in=ids).values_list("workflow_id", "engine_id"))
        stopped = Engine.objects.get(pk="rph-engine").stopped_at
    assert holders == {ids[0]: None, ids[1]: "rph-engine", ids[2]: None}, f"claims after shutdown: {holders}"
    assert stopped is not None, "the engine row was not marked stopped"
