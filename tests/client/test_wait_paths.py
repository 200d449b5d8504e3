"""The latency paths: a wake-up for one workflow is served without the maintenance scans, and
result() waits share one reader connection instead of connecting per call."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from weft_django import client, waits
from weft_django.engine.engine import Engine
from weft_django.engine.wakeups import Listener

pytestmark = pytest.mark.django_db(transaction=True)

MAINTENANCE_SQL = ("weft_django_schedule", "weft_django_queryrequest", "ORDER BY w.created_at")


def _tick_until_parked(engine: Engine, workflow_id: str) -> None:
    for _ in range(200):
        busy = engine.tick()
        if not busy and workflow_id in engine.owned and not engine.executor.running:
            return
        time.sleep(0.01)
    raise AssertionError("the workflow did not park")


def test_a_wake_up_for_one_workflow_skips_the_maintenance_scans():
    engine = Engine("fast-path")
    engine.start()
    try:
        for thread in engine._threads:
            if isinstance(thread, Listener):
                assert thread.connected.wait(5)
        handle = weft.start("tests.signals", id="fast")
        _tick_until_parked(engine, "fast")
        engine._last_maintenance = time.monotonic() + 3600  # the scans are not due during this test
        handle.signal("go", "now")
        engine._on_notify("w:fast")  # what the listener does on PostgreSQL (SQLite has no NOTIFY)
        with CaptureQueriesContext(connection) as captured:
            engine.tick()
        assert handle.status == "completed"
        scans = [q["sql"] for q in captured.captured_queries if any(t in q["sql"] for t in MAINTENANCE_SQL)]
        assert scans == []
    finally:
        engine.shutdown()
    assert handle.result(timeout=5) == "now"


def test_maintenance_still_runs_between_wake_ups(weft_run_until_idle):
    # SQLite (no NOTIFY) relies on it: a signal nobody announced is found by the poll.
    handle = weft.start("tests.signals", id="polled")
    weft_run_until_idle()
    handle.signal("go", "found")
    weft_run_until_idle()
    assert handle.result(timeout=5) == "found"


@pytest.mark.postgres
def test_consecutive_result_waits_share_one_reader_connection(weft_run_until_idle):
    first = weft.start("tests.sum", args=[1, 2])
    second = weft.start("tests.sum", args=[3, 4])
    weft_run_until_idle()
    assert first.result(timeout=5) == {"total": 3}
    listener = waits._listeners["default"]
    reader = listener._reader
    assert reader is not None and not reader.closed
    assert second.result(timeout=5) == {"total": 7}
    assert listener._reader is reader  # no new connection for the second wait
    client.close_connections()
    assert listener.closed() and listener._reader is None
    assert first.result(timeout=5) == {"total": 3}  # the next wait opens them again
