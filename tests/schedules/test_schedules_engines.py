"""Schedules fired by real engine subprocesses: two engines, each occurrence started once."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Count

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import Engine, Workflow
from weft_django.schedules import occurrence_id
from weft_django.status import ACTIVE_STATUSES
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}


def start_engines(weft_engines, *names: str) -> list:
    engines = [weft_engines(name, env=FAST) for name in names]
    wait_for(
        lambda: Engine.objects.filter(id__in=names, stopped_at__isnull=True).count() == len(names),
        timeout=60,
        message="engines registered",
    )
    return engines


def nominal_of(schedule_id: str, run_id: str) -> datetime:
    return datetime.strptime(run_id[len(schedule_id) + 1 :], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def finished_runs(schedule_id: str) -> list[str]:
    return sorted(Workflow.objects.filter(schedule_id=schedule_id, status="completed").values_list("id", flat=True))


def settle(*schedule_ids: str) -> None:
    for schedule_id in schedule_ids:
        weft.get_schedule(schedule_id).pause()
    wait_for(
        lambda: not Workflow.objects.filter(schedule_id__in=schedule_ids, status__in=list(ACTIVE_STATUSES)).exists(),
        timeout=60,
        message="scheduled runs finished",
    )


def assert_each_ran_once(run_ids: list[str]) -> None:
    counts = dict(
        ActivityCall.objects.filter(key__in=run_ids).values_list("key").annotate(n=Count("id")).values_list("key", "n")
    )
    assert counts == dict.fromkeys(run_ids, 1)


def test_every_second_with_two_engines_fires_each_occurrence_once(weft_engines):
    engines = start_engines(weft_engines, "sched-a", "sched-b")
    created = weft.schedule("tests.scheduled_run", id="each", every=1, overlap="allow", backfill=True)
    first_latest = weft.schedule("tests.scheduled_run", id="latest", every=1, overlap="allow").describe()[
        "next_fire_times"
    ][0]  # backfill off: count from its first occurrence (a late first pass may already skip some)
    wait_for(lambda: len(finished_runs("each")) >= 6 and len(finished_runs("latest")) >= 6, timeout=60, message="runs")
    settle("each", "latest")
    for engine in engines:
        assert engine.stop() == 0, engine.output()

    each = finished_runs("each")
    times = [nominal_of("each", run_id) for run_id in each]
    span = int((times[-1] - times[0]).total_seconds()) + 1
    assert times == [times[0] + timedelta(seconds=k) for k in range(span)], each  # no gaps, no duplicates
    assert created.describe()["missed_fire_count"] == 0
    assert_each_ran_once(each)

    latest = finished_runs("latest")
    times = [nominal_of("latest", run_id) for run_id in latest]
    span = int((times[-1] - first_latest).total_seconds()) + 1
    missed = weft.get_schedule("latest").describe()["missed_fire_count"]
    assert len(latest) + missed == span, (latest, missed)  # every occurrence either ran or was counted
    assert_each_ran_once(latest)


def test_backfill_on_and_off_after_the_engines_were_stopped(weft_engines, weft_clock):
    engines = start_engines(weft_engines, "bf-a", "bf-b")
    on = weft.schedule("tests.scheduled_run", id="catch-up", every=60, overlap="allow", backfill=True)
    off = weft.schedule("tests.scheduled_run", id="jump", every=60, overlap="allow")
    first_on, first_off = on.describe()["next_fire_times"][0], off.describe()["next_fire_times"][0]
    for engine in engines:
        assert engine.stop() == 0, engine.output()
    weft_clock.advance((first_on - weft_clock.now()).total_seconds() + 4 * 60 + 10)  # five occurrences passed
    start_engines(weft_engines, "bf-c", "bf-d")
    expected_on = [occurrence_id("catch-up", first_on + timedelta(minutes=k)) for k in range(5)]
    wait_for(lambda: finished_runs("catch-up") == expected_on, timeout=60, message="catch-up runs")
    wait_for(lambda: off.describe()["missed_fire_count"] >= 4, timeout=30, message="missed count")
    settle("catch-up", "jump")
    assert finished_runs("catch-up") == expected_on
    assert on.describe()["missed_fire_count"] == 0
    assert_each_ran_once(expected_on)
    # Backfill off: only the latest occurrence (10 s late, within the grace) ran; four were counted.
    last_off = [run_id for run_id in finished_runs("jump")]
    assert last_off == [occurrence_id("jump", first_off + timedelta(minutes=4))]
    assert off.describe()["missed_fire_count"] == 4
