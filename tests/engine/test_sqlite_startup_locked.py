"""SQLite: ``weft_engine`` started while another connection holds the database's one write lock (a
user's open ``BEGIN IMMEDIATE`` transaction, another engine's long commit) for longer than the engine's
busy timeout. Its start-up writes (the ownership mode marker, its engine row, the claims of a previous
process with its id) waited out the busy timeout, failed with "database is locked", and the command
exited, where the engine's passes wait and retry. The engine must wait for the lock and come up.

The engine's busy timeout is made 1 s (WEFT_SQLITE_TIMEOUT, tests/settings.py) so that a lock held
for a few seconds outlasts it, as one held for a minute outlasts the documented 20 s."""

from __future__ import annotations

import sqlite3
import time

import pytest
from django.db import connections

import weft_django as weft
from weft_django.testing import wait_for

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
RETRYING = "engine start-up waits for the database"


def test_an_engine_started_while_the_write_lock_is_held_waits_for_it_then_runs_workflows(weft_engines):
    blocker = sqlite3.connect(str(connections["default"].settings_dict["NAME"]), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the database's one write lock, until ROLLBACK
    try:
        engine = weft_engines("startup-locked", env={"WEFT_SQLITE_TIMEOUT": "1"})
        # Its first start-up write has waited out the busy timeout: it exited (before) or says it waits.
        wait_for(lambda: engine.process.poll() is not None or RETRYING in engine.output(), timeout=30)
        if engine.process.poll() is None:
            time.sleep(3)  # held past a few more busy timeouts of the engine's start-up
        alive = engine.process.poll() is None
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert alive, engine.output()[-2000:]
    handle = weft.start("tests.sum", args=[1, 2])
    assert handle.result(timeout=30) == {"total": 3}
    assert engine.process.poll() is None


def test_an_engine_waiting_at_start_up_for_the_write_lock_stops_on_sigterm(weft_engines):
    blocker = sqlite3.connect(str(connections["default"].settings_dict["NAME"]), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        engine = weft_engines("startup-locked-stop", env={"WEFT_SQLITE_TIMEOUT": "1"})
        wait_for(lambda: engine.process.poll() is not None or RETRYING in engine.output(), timeout=30)
        engine.terminate()
        code = engine.wait(timeout=30)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert code == 0, engine.output()[-2000:]
