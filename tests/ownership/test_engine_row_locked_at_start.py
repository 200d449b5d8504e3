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
from weft_django.models import Engine
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
