"""Schedules driven in process: the API, the time arithmetic, overlap policies, backfill, jitter.

Workflow time is moved with ``weft_clock`` while no engine runs; ``weft_run_until_idle`` is an engine
that fires what is due, drives the runs and stops."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.conf import get_settings
from weft_django.engine import schedules as firing
from weft_django.exceptions import PayloadNotSerializableError, WorkflowNotRegisteredError
from weft_django.models import Schedule, Workflow
from weft_django.schedules import (
    InvalidScheduleError,
    ScheduleHandle,
    ScheduleNotFoundError,
    Timing,
    occurrence_id,
)

pytestmark = pytest.mark.django_db(transaction=True)

BERLIN = ZoneInfo("Europe/Berlin")
DESCRIBE_KEYS = {
    "id",
    "workflow_type",
    "cron",
    "every",
    "timezone",
    "args",
    "kwargs",
    "overlap",
    "backfill",
    "jitter",
    "paused",
    "note",
    "next_fire_times",
    "last_fired_at",
    "missed_fire_count",
    "running_ids",
}


def runs(schedule_id: str) -> dict[str, str]:
    return dict(Workflow.objects.filter(schedule_id=schedule_id).order_by("id").values_list("id", "status"))


def next_fire(handle: ScheduleHandle) -> datetime:
    return handle.describe()["next_fire_times"][0]


def advance_to(clock, moment: datetime, extra: float = 0.0) -> None:
    """Move workflow time to ``moment`` + ``extra`` seconds."""
    clock.advance((moment - clock.now()).total_seconds() + extra)


def drive(run_until_idle, passes: int = 2) -> None:
    """Several engine runs: a queued run is released by one pass and started by the next."""
    for _ in range(passes):
        run_until_idle()


def set_workflow_time(clock, moment: datetime) -> None:
    clock.set_offset(0)
    clock.set_offset((moment - clock.now()).total_seconds())


# ----------------------------------------------------------------------------------- the time rules


def nominal_times(timing: Timing, after: datetime, count: int) -> list[datetime]:
    first = timing.first_after(after)
    return timing.fire_times(first, count)


def test_cron_across_spring_forward_berlin():
    """02:30 does not exist on 2025-03-30 in Berlin: a fixed-time job fires at 03:30 CEST that day."""
    timing = Timing("nightly", "30 2 * * *", None, "Europe/Berlin", 0)
    times = nominal_times(timing, datetime(2025, 3, 28, 12, tzinfo=BERLIN), 5)
    assert times == [
        datetime(2025, 3, 29, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2025, 3, 30, 1, 30, tzinfo=UTC),  # 03:30 CEST: shifted by the skipped hour
        datetime(2025, 3, 31, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2025, 4, 1, 0, 30, tzinfo=UTC),
        datetime(2025, 4, 2, 0, 30, tzinfo=UTC),
    ]


def test_cron_across_fall_back_berlin():
    """02:30 happens twice on 2025-10-26 in Berlin: a fixed-time job fires once, at the first."""
    timing = Timing("nightly", "30 2 * * *", None, "Europe/Berlin", 0)
    times = nominal_times(timing, datetime(2025, 10, 24, 12, tzinfo=BERLIN), 4)
    assert times == [
        datetime(2025, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2025, 10, 26, 0, 30, tzinfo=UTC),  # the first 02:30 (CEST) only
        datetime(2025, 10, 27, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2025, 10, 28, 1, 30, tzinfo=UTC),
    ]


def test_wildcard_cron_follows_elapsed_time_across_dst():
    """Jobs with a wildcard or step in the minute or hour run on the new time: none in the skipped
    hour, both passes of the repeated hour."""
    every_20 = Timing("often", "*/20 * * * *", None, "Europe/Berlin", 0)
    spring = nominal_times(every_20, datetime(2025, 3, 30, 1, 30, tzinfo=BERLIN), 3)
    assert [t.astimezone(BERLIN).strftime("%H:%M%z") for t in spring] == ["01:40+0100", "03:00+0200", "03:20+0200"]
    autumn = nominal_times(every_20, datetime(2025, 10, 26, 2, 30, tzinfo=BERLIN, fold=0), 5)
    assert [t.astimezone(BERLIN).strftime("%H:%M%z") for t in autumn] == [
        "02:40+0200",
        "02:00+0100",
        "02:20+0100",
        "02:40+0100",
        "03:00+0100",
    ]
    assert all(b - a == timedelta(minutes=20) for a, b in itertools.pairwise(autumn))


def test_every_and_jitter_arithmetic():
    timing = Timing("tick", None, 60, "UTC", 30_000)
    created = datetime(2025, 1, 1, 0, 0, 0, 500, tzinfo=UTC)
    first = timing.first_after(created)
    assert first == datetime(2025, 1, 1, 0, 1, 1, tzinfo=UTC)  # one period after the next whole second
    for nominal in [first + timedelta(minutes=k) for k in range(50)]:
        delay = timing.jitter(nominal)
        assert timedelta(0) <= delay < timedelta(seconds=30)
        assert Timing("tick", None, 60, "UTC", 30_000).jitter(nominal) == delay  # deterministic
    assert len({timing.jitter(first + timedelta(minutes=k)) for k in range(50)}) > 10
    assert Timing("tick", None, 60, "UTC", 0).jitter(first) == timedelta(0)
    assert occurrence_id("tick", first) == "tick@2025-01-01T00:01:01Z"


# ------------------------------------------------------------------------------------------ the API


def test_describe_keys_and_values(weft_clock):
    handle = weft.schedule(
        "tests.scheduled_run",
        id="nightly",
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        kwargs={"label": "n"},
        overlap="queue",
        jitter="5m",
    )
    assert handle == weft.get_schedule("nightly")
    described = handle.describe()
    assert set(described) == DESCRIBE_KEYS
    assert described["workflow_type"] == "tests.scheduled_run"
    assert described["cron"] == "30 2 * * *" and described["every"] is None
    assert described["args"] == [] and described["kwargs"] == {"label": "n"}
    assert described["overlap"] == "queue" and described["backfill"] is False
    assert described["jitter"] == timedelta(minutes=5)
    assert described["paused"] is False and described["note"] == ""
    assert described["last_fired_at"] is None and described["missed_fire_count"] == 0
    assert described["running_ids"] == []
    times = described["next_fire_times"]
    assert len(times) == 5 and times == sorted(times)
    assert all(t.tzinfo is not None and t.utcoffset() == timedelta(0) for t in times)
    for moment in times:
        local = moment.astimezone(BERLIN)
        assert timedelta(0) <= local - local.replace(hour=2, minute=30, second=0, microsecond=0) < timedelta(minutes=5)


def test_next_fire_times_across_dst_through_the_api(weft_clock):
    set_workflow_time(weft_clock, datetime(2025, 3, 28, 12, tzinfo=BERLIN))
    spring = weft.schedule("tests.scheduled_run", id="spring", cron="30 2 * * *", timezone="Europe/Berlin")
    assert spring.describe()["next_fire_times"][:3] == [
        datetime(2025, 3, 29, 1, 30, tzinfo=UTC),
        datetime(2025, 3, 30, 1, 30, tzinfo=UTC),
        datetime(2025, 3, 31, 0, 30, tzinfo=UTC),
    ]
    set_workflow_time(weft_clock, datetime(2025, 10, 24, 12, tzinfo=BERLIN))
    autumn = weft.schedule("tests.scheduled_run", id="autumn", cron="30 2 * * *", timezone=BERLIN)
    assert autumn.describe()["next_fire_times"][:3] == [
        datetime(2025, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2025, 10, 26, 0, 30, tzinfo=UTC),
        datetime(2025, 10, 27, 1, 30, tzinfo=UTC),
    ]


def test_dst_occurrence_fires_with_its_nominal_utc_id(weft_clock, weft_run_until_idle):
    set_workflow_time(weft_clock, datetime(2025, 3, 30, 1, 0, tzinfo=BERLIN))
    weft.schedule("tests.scheduled_run", id="gap", cron="30 2 * * *", timezone="Europe/Berlin")
    advance_to(weft_clock, datetime(2025, 3, 30, 1, 30, tzinfo=UTC), extra=1)
    weft_run_until_idle()
    assert runs("gap") == {"gap@2025-03-30T01:30:00Z": "completed"}


def test_every_fires_one_period_after_creation(weft_clock, weft_run_until_idle):
    before = weft_clock.now()
    handle = weft.schedule("tests.scheduled_run", id="tick", every="1m", args=["x"])
    first = next_fire(handle)
    assert timedelta(seconds=60) <= first - before <= timedelta(seconds=62)
    assert first.microsecond == 0
    weft_run_until_idle()
    assert runs("tick") == {}
    advance_to(weft_clock, first, extra=0.5)
    weft_run_until_idle()
    run_id = f"tick@{first:%Y-%m-%dT%H:%M:%SZ}"
    assert runs("tick") == {run_id: "completed"}
    assert weft.get_handle(run_id).result(timeout=5) == {"id": run_id, "label": "x"}
    described = handle.describe()
    assert described["last_fired_at"] is not None
    assert described["missed_fire_count"] == 0
    assert described["next_fire_times"][0] == first + timedelta(seconds=60)
    assert ActivityCall.objects.filter(key=run_id).count() == 1


def test_upsert_is_idempotent_and_keeps_pause_state(weft_clock):
    handle = weft.schedule("tests.scheduled_run", id="same", every=3600)
    row = Schedule.objects.get(pk="same")
    weft_clock.advance(120)
    assert weft.schedule("tests.scheduled_run", id="same", every=3600) == handle  # a redeploy re-declares it
    again = Schedule.objects.get(pk="same")
    assert (again.next_fire_at, again.updated_at) == (row.next_fire_at, row.updated_at)
    handle.pause(note="db migration")
    weft.schedule("tests.scheduled_run", id="same", every=3600, overlap="allow")
    described = handle.describe()
    assert described["paused"] is True and described["note"] == "db migration"
    assert described["overlap"] == "allow" and described["next_fire_times"] == []
    assert Schedule.objects.count() == 1


def test_update_changes_only_what_is_given(weft_clock):
    handle = weft.schedule("tests.scheduled_run", id="upd", every=60, args=["a"])
    first = next_fire(handle)
    handle.update(overlap="allow", kwargs={"label": "b"}, args=[])
    described = handle.describe()
    assert described["overlap"] == "allow" and described["kwargs"] == {"label": "b"} and described["args"] == []
    assert described["next_fire_times"][0] == first  # timing unchanged: next fire kept
    weft_clock.advance(10)
    handle.update(every=600)
    assert next_fire(handle) - weft_clock.now() > timedelta(seconds=590)  # re-planned from now
    handle.update(cron="0 * * * *")
    described = handle.describe()
    assert described["cron"] == "0 * * * *" and described["every"] is None
    assert all(t.minute == 0 and t.second == 0 for t in described["next_fire_times"])
    handle.update(every=30)
    assert handle.describe()["cron"] is None
    with pytest.raises(InvalidScheduleError):
        handle.update(cron="0 * * * *", every=30)
    with pytest.raises(InvalidScheduleError):
        handle.update(overlap="sometimes")
    assert handle.describe()["every"] == 30 and handle.describe()["overlap"] == "allow"


def test_pause_resume(weft_clock, weft_run_until_idle):
    handle = weft.schedule("tests.scheduled_run", id="pausable", every=60)
    first = next_fire(handle)
    handle.pause(note="maintenance window")
    described = handle.describe()
    assert (described["paused"], described["note"], described["next_fire_times"]) == (True, "maintenance window", [])
    advance_to(weft_clock, first, extra=300)
    weft_run_until_idle()
    assert runs("pausable") == {}
    handle.resume()
    described = handle.describe()
    assert (described["paused"], described["note"]) == (False, "")
    resumed = described["next_fire_times"][0]
    assert weft_clock.now() < resumed <= weft_clock.now() + timedelta(seconds=60)
    assert (resumed - first) % timedelta(seconds=60) == timedelta(0)  # the interval keeps its phase
    weft_run_until_idle()
    assert runs("pausable") == {} and handle.describe()["missed_fire_count"] == 0  # paused fires are not missed
    advance_to(weft_clock, resumed, extra=1)
    weft_run_until_idle()
    assert runs("pausable") == {occurrence_id("pausable", resumed): "completed"}


def test_trigger_starts_now_even_while_paused(weft_run_until_idle):
    handle = weft.schedule("tests.scheduled_run", id="manual", cron="0 0 1 1 *")
    handle.pause()
    started = handle.trigger()
    assert started is not None and re.fullmatch(r"manual@manual-[0-9a-f]{8}", started.id)
    weft_run_until_idle()
    assert started.result(timeout=5)["id"] == started.id
    assert Workflow.objects.get(pk=started.id).schedule_id == "manual"
    assert handle.describe()["last_fired_at"] is not None


def test_trigger_is_subject_to_overlap(weft_run_until_idle):
    handle = weft.schedule("tests.signals", id="busy", every=3600)
    first = handle.trigger()
    assert first is not None
    weft_run_until_idle()
    assert handle.trigger() is None  # overlap="skip": the first run still occupies the slot
    assert handle.describe()["running_ids"] == [first.id]
    handle.update(overlap="allow")
    second = handle.trigger()
    assert second is not None and set(handle.describe()["running_ids"]) == {first.id, second.id}


def test_delete(weft_clock, weft_run_until_idle):
    handle = weft.schedule("tests.signals", id="doomed", every=60, overlap="queue")
    first = next_fire(handle)
    advance_to(weft_clock, first, extra=1)
    weft_run_until_idle()
    advance_to(weft_clock, first + timedelta(seconds=60), extra=1)
    weft_run_until_idle()
    running, queued = occurrence_id("doomed", first), occurrence_id("doomed", first + timedelta(seconds=60))
    assert runs("doomed") == {running: "running", queued: "pending"}
    handle.delete()
    with pytest.raises(ScheduleNotFoundError):
        weft.get_schedule("doomed")
    with pytest.raises(ScheduleNotFoundError):
        handle.describe()
    with pytest.raises(ScheduleNotFoundError):
        handle.pause()
    assert runs("doomed") == {running: "running", queued: "cancelled"}  # started runs go on; the queued one ends
    weft_clock.advance(600)
    weft_run_until_idle()
    assert len(runs("doomed")) == 2


def test_get_schedule_unknown():
    with pytest.raises(ScheduleNotFoundError, match='No schedule "nope"'):
        weft.get_schedule("nope")
    assert issubclass(ScheduleNotFoundError, weft.WeftError)


NOT_SERIALISABLE = object()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"cron": "61 * * * *"}, InvalidScheduleError, "not a valid cron expression"),
        ({"cron": "* * * *"}, InvalidScheduleError, "has 4 field"),
        ({"cron": "* * * * * *"}, InvalidScheduleError, "every="),
        ({"cron": "@reboot"}, InvalidScheduleError, "field"),
        ({"cron": "R * * * *"}, InvalidScheduleError, "random"),
        ({"cron": "0 0 30 2 *"}, InvalidScheduleError, "never matches"),
        ({"cron": ""}, InvalidScheduleError, "cron must be"),
        ({}, InvalidScheduleError, "neither was given"),
        ({"cron": "* * * * *", "every": 60}, InvalidScheduleError, "not both"),
        ({"every": 0}, InvalidScheduleError, "at least 1"),
        ({"every": -5}, InvalidScheduleError, "at least 1"),
        ({"every": 1.5}, InvalidScheduleError, "whole number"),
        ({"every": "1500ms"}, InvalidScheduleError, "whole number"),
        ({"every": True}, InvalidScheduleError, "whole number"),
        ({"every": "soon"}, InvalidScheduleError, "duration"),
        ({"every": 60, "timezone": "Europe/Berln"}, InvalidScheduleError, 'Did you mean "Europe/Berlin"'),
        ({"every": 60, "timezone": ""}, InvalidScheduleError, "IANA"),
        ({"every": 60, "timezone": 5}, InvalidScheduleError, "IANA"),
        ({"every": 60, "timezone": ["UTC"]}, InvalidScheduleError, "IANA"),
        ({"every": 60, "timezone": "../etc/localtime"}, InvalidScheduleError, "IANA"),
        ({"every": 60, "timezone": "/etc/localtime"}, InvalidScheduleError, "IANA"),
        ({"every": 60, "timezone": "Europe/Berlin\x00"}, InvalidScheduleError, "IANA"),
        ({"every": 60, "overlap": "cancel-running"}, InvalidScheduleError, 'Did you mean "cancel_running"'),
        ({"every": 60, "overlap": "never"}, InvalidScheduleError, "overlap must be one of"),
        ({"every": 60, "jitter": -1}, InvalidScheduleError, "jitter must be between"),
        ({"every": 60, "jitter": "a bit"}, InvalidScheduleError, "jitter must be a duration"),
        ({"every": 60, "jitter": "30d"}, InvalidScheduleError, "jitter must be between"),
        ({"every": 60, "backfill": "yes"}, InvalidScheduleError, "backfill must be True or False"),
        ({"every": 60, "args": "abc"}, InvalidScheduleError, "args must be a list"),
        ({"every": 60, "kwargs": {1: 2}}, InvalidScheduleError, "kwargs must be a dict"),
        ({"every": 60, "args": [NOT_SERIALISABLE]}, PayloadNotSerializableError, r"args\[0\]"),
        ({"every": 60, "kwargs": {"when": {1, NOT_SERIALISABLE}}}, PayloadNotSerializableError, "kwargs"),
        ({"every": 60, "id": ""}, InvalidScheduleError, "id must be a str of 1 to 200"),
        ({"every": 60, "id": "x" * 201}, InvalidScheduleError, "id must be a str of 1 to 200"),
        ({"every": 60, "id": "bad\nid"}, InvalidScheduleError, "control characters"),
        ({"every": 60, "workflow": "tests.unknown"}, WorkflowNotRegisteredError, "tests.unknown"),
    ],
)
def test_bad_input_raises_and_writes_nothing(options, error, message):
    arguments = {"id": "bad", "workflow": "tests.scheduled_run", **options}
    workflow = arguments.pop("workflow")
    with pytest.raises(error, match=message):
        weft.schedule(workflow, **arguments)
    assert not Schedule.objects.exists()
    assert issubclass(error, weft.WeftError)


def test_bad_update_leaves_the_schedule_unchanged():
    handle = weft.schedule("tests.scheduled_run", id="stable", every=60)
    before = Schedule.objects.values().get(pk="stable")
    for bad in ({"every": 0}, {"timezone": "Mars/Olympus"}, {"cron": "nope"}, {"args": [NOT_SERIALISABLE]}):
        with pytest.raises(weft.WeftError):
            handle.update(**bad)
    assert Schedule.objects.values().get(pk="stable") == before


# --------------------------------------------------------------------------------- overlap policies


def start_first_occurrence(clock, run_until_idle, schedule_id: str, overlap: str) -> tuple[ScheduleHandle, datetime]:
    """A schedule of tests.signals (waits for "go") whose first run is running; returns its nominal time."""
    handle = weft.schedule("tests.signals", id=schedule_id, every=60, overlap=overlap)
    first = next_fire(handle)
    advance_to(clock, first, extra=1)
    run_until_idle()
    assert runs(schedule_id) == {occurrence_id(schedule_id, first): "running"}
    return handle, first


def fire_next(clock, run_until_idle, handle: ScheduleHandle) -> datetime:
    nominal = next_fire(handle)
    advance_to(clock, nominal, extra=1)
    drive(run_until_idle)
    return nominal


def test_overlap_skip(weft_clock, weft_run_until_idle):
    handle, first = start_first_occurrence(weft_clock, weft_run_until_idle, "o-skip", "skip")
    fire_next(weft_clock, weft_run_until_idle, handle)
    assert runs("o-skip") == {occurrence_id("o-skip", first): "running"}
    assert handle.describe()["missed_fire_count"] == 0  # skipped by policy, not missed
    weft.signal(occurrence_id("o-skip", first), "go", "done")
    weft_run_until_idle()
    third = fire_next(weft_clock, weft_run_until_idle, handle)
    assert runs("o-skip") == {occurrence_id("o-skip", first): "completed", occurrence_id("o-skip", third): "running"}


def test_overlap_skip_counts_a_suspended_run(weft_clock, weft_run_until_idle):
    handle, first = start_first_occurrence(weft_clock, weft_run_until_idle, "o-susp", "skip")
    weft.get_handle(occurrence_id("o-susp", first)).suspend()
    fire_next(weft_clock, weft_run_until_idle, handle)
    assert runs("o-susp") == {occurrence_id("o-susp", first): "suspended"}
    assert handle.describe()["running_ids"] == [occurrence_id("o-susp", first)]


def test_overlap_queue_keeps_one_and_starts_it_when_the_slot_frees(weft_clock, weft_run_until_idle):
    handle, first = start_first_occurrence(weft_clock, weft_run_until_idle, "o-queue", "queue")
    second = fire_next(weft_clock, weft_run_until_idle, handle)
    third = fire_next(weft_clock, weft_run_until_idle, handle)  # dropped: one occurrence waits already
    one, two = occurrence_id("o-queue", first), occurrence_id("o-queue", second)
    assert runs("o-queue") == {one: "running", two: "pending"}
    assert occurrence_id("o-queue", third) not in runs("o-queue")
    assert handle.describe()["running_ids"] == [one, two]
    weft.signal(one, "go", 1)
    drive(weft_run_until_idle, passes=3)
    assert runs("o-queue") == {one: "completed", two: "running"}
    weft.signal(two, "go", 2)
    drive(weft_run_until_idle)
    assert weft.get_handle(two).result(timeout=5) == 2


def test_overlap_queue_with_a_suspended_run(weft_clock, weft_run_until_idle):
    handle, first = start_first_occurrence(weft_clock, weft_run_until_idle, "o-qs", "queue")
    one = occurrence_id("o-qs", first)
    weft.get_handle(one).suspend()
    second = fire_next(weft_clock, weft_run_until_idle, handle)
    drive(weft_run_until_idle)
    assert runs("o-qs") == {one: "suspended", occurrence_id("o-qs", second): "pending"}  # still waiting


def test_overlap_cancel_running(weft_clock, weft_run_until_idle):
    handle, first = start_first_occurrence(weft_clock, weft_run_until_idle, "o-cancel", "cancel_running")
    second = fire_next(weft_clock, weft_run_until_idle, handle)
    one, two = occurrence_id("o-cancel", first), occurrence_id("o-cancel", second)
    assert runs("o-cancel") == {one: "cancelled", two: "running"}
    reason = Workflow.objects.get(pk=one).cancel_reason
    assert "o-cancel" in reason and "cancel_running" in reason
    with pytest.raises(weft.WorkflowCancelledError):
        weft.get_handle(one).result(timeout=5)


def test_overlap_allow(weft_clock, weft_run_until_idle):
    handle, first = start_first_occurrence(weft_clock, weft_run_until_idle, "o-allow", "allow")
    second = fire_next(weft_clock, weft_run_until_idle, handle)
    assert runs("o-allow") == {occurrence_id("o-allow", first): "running", occurrence_id("o-allow", second): "running"}
    assert len(handle.describe()["running_ids"]) == 2


# ---------------------------------------------------------------------------------- backfill, jitter


def test_backfill_off_counts_missed_fires_and_jumps_ahead(weft_clock, weft_run_until_idle):
    handle = weft.schedule("tests.scheduled_run", id="bf-off", every=300, overlap="allow")
    first = next_fire(handle)
    advance_to(weft_clock, first + timedelta(seconds=3 * 300), extra=120)  # engines down for ~20 minutes
    weft_run_until_idle()
    described = handle.describe()
    assert runs("bf-off") == {}  # the latest occurrence is 2 minutes late: past the grace, missed too
    assert described["missed_fire_count"] == 4
    assert described["next_fire_times"][0] == first + timedelta(seconds=4 * 300)
    advance_to(weft_clock, first + timedelta(seconds=6 * 300), extra=30)  # 30 s late: within the grace
    weft_run_until_idle()
    assert runs("bf-off") == {occurrence_id("bf-off", first + timedelta(seconds=6 * 300)): "completed"}
    assert handle.describe()["missed_fire_count"] == 6


def test_backfill_off_cron_counts_missed(weft_clock, weft_run_until_idle):
    handle = weft.schedule("tests.scheduled_run", id="bf-cron", cron="*/5 * * * *", overlap="allow")
    first = next_fire(handle)
    advance_to(weft_clock, first + timedelta(hours=2), extra=10)
    weft_run_until_idle()
    latest = first + timedelta(hours=2)
    assert runs("bf-cron") == {occurrence_id("bf-cron", latest): "completed"}
    assert handle.describe()["missed_fire_count"] == 24


def test_backfill_on_fires_every_missed_occurrence(weft_clock, weft_run_until_idle):
    handle = weft.schedule("tests.scheduled_run", id="bf-on", every=300, overlap="allow", backfill=True)
    first = next_fire(handle)
    advance_to(weft_clock, first + timedelta(seconds=3 * 300), extra=120)
    weft_run_until_idle()
    expected = {occurrence_id("bf-on", first + timedelta(seconds=k * 300)): "completed" for k in range(4)}
    assert runs("bf-on") == expected
    assert handle.describe()["missed_fire_count"] == 0
    assert all(ActivityCall.objects.filter(key=run_id).count() == 1 for run_id in expected)


def test_backfill_is_bounded_per_pass(weft_clock, monkeypatch):
    monkeypatch.setattr(firing, "BACKFILL_PER_PASS", 3)
    handle = weft.schedule("tests.scheduled_run", id="bf-bound", every=60, overlap="allow", backfill=True)
    first = next_fire(handle)
    advance_to(weft_clock, first + timedelta(seconds=7 * 60), extra=1)  # 8 occurrences due
    engine = SimpleNamespace(using="default", settings=get_settings())
    chore = firing.ScheduleFiring()
    counts = []
    for _ in range(4):
        chore.run(engine, weft_clock.now())  # type: ignore[arg-type]
        counts.append(len(runs("bf-bound")))
    assert counts == [3, 6, 8, 8]
    assert set(runs("bf-bound")) == {occurrence_id("bf-bound", first + timedelta(seconds=k * 60)) for k in range(8)}


def test_backfill_with_skip_starts_only_the_first(weft_clock, weft_run_until_idle):
    handle = weft.schedule("tests.signals", id="bf-skip", every=60, backfill=True)
    first = next_fire(handle)
    advance_to(weft_clock, first + timedelta(seconds=4 * 60), extra=1)
    weft_run_until_idle()
    assert runs("bf-skip") == {occurrence_id("bf-skip", first): "running"}  # the rest overlapped it


def test_jitter_delays_the_fire_not_the_id(weft_clock, weft_run_until_idle):
    handle = weft.schedule("tests.scheduled_run", id="jit", every=3600, jitter="10m")
    row = Schedule.objects.get(pk="jit")
    nominal, fire_at = row.next_nominal_at, row.next_fire_at
    delay = Timing.of(row).jitter(nominal)
    assert fire_at == nominal + delay == next_fire(handle)
    assert timedelta(0) <= delay < timedelta(minutes=10)
    if delay > timedelta(seconds=2):
        advance_to(weft_clock, nominal, extra=1)
        weft_run_until_idle()
        assert runs("jit") == {}  # nominally due, but its jitter has not passed
    advance_to(weft_clock, fire_at, extra=1)
    weft_run_until_idle()
    assert runs("jit") == {occurrence_id("jit", nominal): "completed"}


def test_an_existing_run_id_is_not_duplicated(weft_clock, weft_run_until_idle):
    """An occurrence whose run id already exists (a re-created schedule) keeps that run."""
    handle = weft.schedule("tests.scheduled_run", id="dup", every=60)
    first = next_fire(handle)
    taken = weft.start("tests.scheduled_run", id=occurrence_id("dup", first), kwargs={"label": "earlier"})
    weft_run_until_idle()
    advance_to(weft_clock, first, extra=1)
    weft_run_until_idle()
    assert taken.result(timeout=5)["label"] == "earlier"
    assert Workflow.objects.filter(pk__startswith="dup@").count() == 1
    assert ActivityCall.objects.filter(key=taken.id).count() == 1


def chore_pass(clock) -> bool:
    engine = SimpleNamespace(using="default", settings=get_settings())
    return firing.ScheduleFiring().run(engine, clock.now())  # type: ignore[arg-type]


def test_a_row_written_without_the_api_is_planned_not_fired(weft_clock):
    now = weft_clock.now()
    Schedule.objects.create(
        id="raw", workflow_type="tests.scheduled_run", every=60, next_fire_at=now, created_at=now, updated_at=now
    )
    assert chore_pass(weft_clock) is True
    row = Schedule.objects.get(pk="raw")
    assert row.next_nominal_at is not None and row.next_fire_at > now
    assert runs("raw") == {}


def test_a_type_this_engine_lacks_is_left_to_other_engines(weft_clock, caplog):
    handle = weft.schedule("tests.scheduled_run", id="foreign", every=60)
    Schedule.objects.filter(pk="foreign").update(workflow_type="elsewhere.only")
    advance_to(weft_clock, next_fire(handle), extra=1)
    engine = SimpleNamespace(using="default", settings=get_settings())
    chore = firing.ScheduleFiring()
    assert chore.run(engine, weft_clock.now()) is False  # type: ignore[arg-type]
    assert chore.run(engine, weft_clock.now()) is False  # type: ignore[arg-type]
    assert runs("foreign") == {}
    assert [r.message for r in caplog.records].count(
        "schedule not fired here: workflow type is not registered in this engine "
        "schedule=foreign workflow_type=elsewhere.only"
    ) == 1
    assert Schedule.objects.get(pk="foreign").missed_fire_count == 0  # an engine that has it will fire it
