"""OWNERSHIP="lease": shutdown finishes when a user's open transaction holds the store lease's row
(SELECT ... FOR UPDATE in psql).

The release of the lease at shutdown was a plain UPDATE of that row: it waited out the engine session's
lock_timeout (half the TTL: 15 s with the defaults, on top of the drain, past an orchestrator's grace
period set a few seconds above --drain-timeout), then failed, and the failure skipped the rest of the
shutdown: the engine row was never marked stopped ('could not release claims at shutdown'). As the
claims' release does (tests/ownership/test_release_past_a_held_row.py), the lease waits a moment for
the row and is otherwise left held, to expire."""

from __future__ import annotations

import pytest
from django.db import connection

import weft_django as weft
from tests.engine.test_commit_locks import holding
from weft_django.models import Engine, StoreLease, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s"}


def test_a_lease_row_held_by_a_user_does_not_keep_the_engine_from_stopping(weft_engines):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    weft.start("tests.signals", id="lrh")
    engine = weft_engines("lrh-engine", weft=LEASE)
    wait_for(lambda: engine.claims().keys() == {"lrh"}, timeout=30, message="the engine holds the claim")
    with holding("SELECT 1 FROM weft_django_storelease WHERE id = 1 FOR UPDATE", [], hold_at_most=40):
        assert engine.stop() == 0, engine.output()
        stopped = Engine.objects.get(pk="lrh-engine").stopped_at
        holder = WorkflowClaim.objects.get(pk="lrh").engine_id
    assert stopped is not None, f"the engine row was not marked stopped:\n{engine.output()[-3000:]}"
    assert "store lease left held at shutdown engine=lrh-engine" in engine.output()
    assert holder is None, f"the claim was not released: held by {holder}"
    assert StoreLease.objects.get().engine_id == "lrh-engine", "the lease row was written while a user held it"
