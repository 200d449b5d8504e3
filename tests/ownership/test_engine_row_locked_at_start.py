"""``weft_engine`` started while a user's open transaction holds its own engine row (a restart under the
same ``--engine-id``, or the same hostname-derived id, while a psql or admin session keeps ``SELECT ... FOR
UPDATE`` on it). Start-up checks the ownership mode marker (locked FOR UPDATE, on purpose) and writes its
engine row in one transaction. The row's UPDATE waited out the session's lock_timeout (15 s) with the
marker locked, failed, and was tried again, for as long as the row was held: every other engine's
start-up (and ``--reset-ownership-mode``) waited on the marker up to 15 s at a time, and the engine said
only ``canceling statement due to lock timeout``.

Now the row is waited for COMMIT_LOCK_WAIT_MS at most, the transaction (and the marker) let go, and the
engine says which row it waits for; it comes up once the row is free."""

from __future__ import annotations

import time

import pytest
from django.db import connection

import weft_django as weft
from tests.engine.locked import Held, row_lock
from weft_django.models import Engine, OwnershipMarker
from weft_django.store.clock import db_clock
from weft_django.testing import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]
WAITS = "engine start-up waits for the database engine=ers-restarted step=mode marker and engine row"


def test_an_engine_whose_row_a_user_holds_at_start_up_neither_holds_up_others_nor_stays_vague(weft_engines):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    now = db_clock("default")
    # the row a previous process with this id left (stopped), then held by a user's open transaction
    Engine.objects.create(
        id="ers-restarted", host="h", pid=1, mode="workflow-lease", started_at=now, heartbeat_at=now, stopped_at=now
    )
    with Held(*row_lock("engine", "id", "ers-restarted"), hold_at_most=90) as held:
        restarted = weft_engines("ers-restarted")
        wait_for(lambda: WAITS in restarted.output(), timeout=30, message="the restarted engine waits for its row")
        began = time.monotonic()
        weft_engines("ers-other")  # another engine started meanwhile: it checks the same marker
        handle = weft.start("tests.sum", args=[2, 3])
        assert handle.result(timeout=40) == {"total": 5}
        took = time.monotonic() - began
        assert took < 8, f"another engine's start-up waited {took:.1f}s for the ownership marker"
        line = next(line for line in restarted.output().splitlines() if WAITS in line)
        assert "weft_django_engine" in line and "ers-restarted" in line, line
        assert restarted.process.poll() is None and not held.released.is_set()
    wait_for(lambda: Engine.objects.get(pk="ers-restarted").pid != 1, timeout=20, message="registered once free")
    assert Engine.objects.get(pk="ers-restarted").stopped_at is None


def test_an_engine_whose_ownership_marker_a_user_holds_says_which_row_it_waits_for(weft_engines):
    """The marker stays locked FOR UPDATE and waited for (the session's lock_timeout): the engine cannot
    check its mode without it. It said only ``canceling statement due to lock timeout``; now the line
    names the row, and the engine comes up once the row is free."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    OwnershipMarker.objects.create(id=1, mode="workflow-lease", set_by="earlier", set_at=db_clock("default"))
    fast = {"WORKFLOW_CLAIM_TTL": "4s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"}  # lock_timeout 2 s
    with Held(*row_lock("ownershipmarker", "id", 1), hold_at_most=60):
        engine = weft_engines("ers-marker", weft=fast)
        waits = "engine start-up waits for the database engine=ers-marker step=mode marker and engine row"
        wait_for(lambda: waits in engine.output(), timeout=30, message="the engine waits for the marker")
        line = next(line for line in engine.output().splitlines() if waits in line)
        assert "row id=1 of weft_django_ownershipmarker is locked by another transaction" in line, line
        assert not Engine.objects.filter(pk="ers-marker").exists()
    handle = weft.start("tests.sum", args=[1, 1])
    assert handle.result(timeout=30) == {"total": 2}
    assert Engine.objects.get(pk="ers-marker").stopped_at is None
