"""Schedules, from a review: backfill with overlap="queue" (what docs/schedules.md says it does), and a
missed count at its column's maximum (the schedule goes on firing)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

import weft_django as weft
from weft_django.conf import get_settings
from weft_django.engine import schedules as firing
from weft_django.models import Schedule, Workflow
from weft_django.schedules import occurrence_id

pytestmark = pytest.mark.django_db(transaction=True)


def engine() -> SimpleNamespace:
    return SimpleNamespace(using="default", settings=get_settings())


def runs(schedule_id: str) -> dict[str, str]:
    return dict(Workflow.objects.filter(schedule_id=schedule_id).values_list("id", "status"))


def test_backfill_with_queue_starts_the_first_keeps_one_waiting_and_skips_the_rest(weft_clock):
    """docs/schedules.md said "use allow or queue to run them" (every catch-up occurrence); "queue" keeps
    at most one occurrence waiting, so 2 of the 5 ran (the docs now say so)."""
    handle = weft.schedule("tests.signals", id="bf-q", every=60, overlap="queue", backfill=True)
    first = handle.describe()["next_fire_times"][0]
    weft_clock.advance((first - weft_clock.now()).total_seconds() + 4 * 60 + 1)  # 5 occurrences due
    firing.ScheduleFiring().run(engine(), weft_clock.now())
    expected = {
        occurrence_id("bf-q", first): "running",
        occurrence_id("bf-q", first + timedelta(seconds=60)): "pending",
    }
    assert (runs("bf-q"), Schedule.objects.get(pk="bf-q").missed_fire_count) == (expected, 0)


MAX_COUNT = 2**31 - 1  # missed_fire_count: a PositiveIntegerField (integer on PostgreSQL)


def test_a_missed_count_at_its_maximum_stays_there_and_the_schedule_fires(weft_clock):
    """A row whose missed_fire_count is at the column's maximum (restored, or years of misses): one more
    missed occurrence overflowed it (DataError on PostgreSQL), the pass was rolled back and backed off,
    and the schedule never fired again; SQLite stored a count past the column's range."""
    handle = weft.schedule("tests.scheduled_run", id="max", every=60, overlap="allow")
    Schedule.objects.filter(pk="max").update(missed_fire_count=MAX_COUNT)
    first = handle.describe()["next_fire_times"][0]
    weft_clock.advance((first - weft_clock.now()).total_seconds() + 5 * 60 + 1)  # 5 missed, the 6th in time
    firing.ScheduleFiring().run(engine(), weft_clock.now())
    latest = occurrence_id("max", first + timedelta(seconds=5 * 60))
    row = Schedule.objects.get(pk="max")
    assert (set(runs("max")), row.missed_fire_count) == ({latest}, MAX_COUNT)


def test_a_new_time_zone_keeps_the_next_fire_of_an_interval_schedule(weft_clock):
    """``every`` does not depend on the time zone (only a cron is read in it). A redeploy that declared an
    every=86400 schedule with another timezone re-planned it one day from then: the occurrence due a
    minute later never ran, and was not counted as missed."""
    handle = weft.schedule("tests.scheduled_run", id="tz", every=86400)
    first = handle.describe()["next_fire_times"][0]
    weft_clock.advance((first - weft_clock.now()).total_seconds() - 60)  # a minute before it fires
    weft.schedule("tests.scheduled_run", id="tz", every=86400, timezone="Europe/Berlin")
    assert (handle.describe()["timezone"], handle.describe()["next_fire_times"][0]) == ("Europe/Berlin", first)
