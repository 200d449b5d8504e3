"""The engine's workflow time: on PostgreSQL one database clock reading serves the passes of the next
CLOCK_REUSE seconds; a test's offset change, a rescan, or SQLite makes a pass read it again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from weft_django.engine import engine as engine_module
from weft_django.engine.engine import Engine
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)


def clock_reads(queries) -> int:
    return sum("clock_offset" in q["sql"] or "clockoffset" in q["sql"] for q in queries)


@pytest.fixture
def engine():
    running = Engine("clock-engine")
    running.start()
    yield running
    running.shutdown()


@pytest.mark.postgres
def test_passes_within_the_reuse_window_do_not_read_the_clock(engine):
    first = engine._workflow_now(fresh=False)
    with CaptureQueriesContext(connection) as queries:
        second = engine._workflow_now(fresh=False)
        third = engine._workflow_now(fresh=False)
    assert clock_reads(queries) == 0
    assert first <= second <= third  # the reading plus the monotonic time since
    assert abs(db_now() - third) < timedelta(milliseconds=100)


@pytest.mark.postgres
def test_a_reading_older_than_the_window_or_a_rescan_reads_again(engine, monkeypatch):
    engine._workflow_now(fresh=False)
    with CaptureQueriesContext(connection) as queries:
        engine._workflow_now(fresh=True)  # a rescan (":*" wake-up: e.g. another process moved the offset)
    assert clock_reads(queries) == 1
    monkeypatch.setattr(engine_module, "CLOCK_REUSE", 0.0)
    with CaptureQueriesContext(connection) as queries:
        engine._workflow_now(fresh=False)
    assert clock_reads(queries) == 1


@pytest.mark.postgres
def test_an_offset_change_in_this_process_is_seen_by_the_next_pass(engine, weft_clock):
    before = engine._workflow_now(fresh=False)
    weft_clock.advance(3600)
    after = engine._workflow_now(fresh=False)
    assert after - before >= timedelta(hours=1)
    weft_clock.set_offset(0)  # and back: a reading behind the last one is taken as it is
    assert engine._workflow_now(fresh=False) < after - timedelta(minutes=59)


@pytest.mark.sqlite
def test_sqlite_reads_the_clock_on_every_pass(engine):
    engine._workflow_now(fresh=False)
    with CaptureQueriesContext(connection) as queries:
        engine._workflow_now(fresh=False)
    assert clock_reads(queries) == 1
