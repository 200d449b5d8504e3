"""A stored schedule row the code cannot compute with (edited by hand, restored from elsewhere) raises
one typed error, UnusableScheduleError, naming the schedule, the column and the repair, from the
handle's resume(), trigger() and describe(); and update() repairs undecodable args / kwargs by
replacing them (the stored text is decoded only when it is kept)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import weft_django as weft
from weft_django.models import Schedule, Workflow

pytestmark = pytest.mark.django_db

FAR = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
# name -> (the columns written by hand, the column the error names)
BAD_TIMING = {
    "bad-cron": ({"cron": "not a cron", "every": None}, "cron"),
    "six-field-cron": ({"cron": "* * * * * *", "every": None}, "cron"),
    "never-cron": ({"cron": "0 0 30 2 *", "every": None}, "cron"),
    "bad-zone": ({"cron": "* * * * *", "every": None, "timezone": "Mars/Olympus"}, "timezone"),
    "zero-every": ({"every": 0}, "every"),
    "both": ({"cron": "* * * * *"}, "cron"),
    "far-nominal": ({"next_nominal_at": FAR}, "next_nominal_at"),
    # croniter (dateutil) raises ValueError "year 10000 is out of range", not OverflowError
    "far-nominal-cron": ({"cron": "0 0 1 1 *", "every": None, "next_nominal_at": FAR}, "next_nominal_at"),
    # every match (02:00-02:40 on the second Sunday of March) is in New York's spring-forward gap
    "gap-only-cron": ({"cron": "*/20 2 * 3 0#2", "every": None, "timezone": "America/New_York"}, "cron"),
}
BAD_ARGUMENTS = {
    "args": {"args": "{not json"},
    "kwargs": {"kwargs": "{not json"},
    "args-not-a-list": {"args": "{}"},
}


def _assert_names_the_row(exc: weft.UnusableScheduleError, column: str) -> None:
    assert isinstance(exc, weft.InvalidScheduleError) and isinstance(exc, ValueError)
    assert (exc.schedule_id, exc.column) == ("odd", column)
    text = str(exc)
    assert '"odd"' in text and f"its {column}" in text and "update(" in text and "delete it" in text, text


@pytest.mark.parametrize("name", list(BAD_TIMING))
def test_describe_of_a_row_with_unusable_timing_names_the_column(name):
    weft.schedule("tests.scheduled_run", id="odd", every=60)
    columns, column = BAD_TIMING[name]
    Schedule.objects.filter(pk="odd").update(**columns)
    with pytest.raises(weft.UnusableScheduleError) as caught:
        weft.get_schedule("odd").describe()
    _assert_names_the_row(caught.value, column)


@pytest.mark.parametrize("name", [name for name in BAD_TIMING if not name.startswith("far-nominal")])
def test_resume_of_a_row_with_unusable_timing_names_the_column_and_writes_nothing(name):
    handle = weft.schedule("tests.scheduled_run", id="odd", every=60)
    handle.pause()
    columns, column = BAD_TIMING[name]
    day_ago = Schedule.objects.get(pk="odd").next_nominal_at - timedelta(days=1)
    Schedule.objects.filter(pk="odd").update(next_nominal_at=day_ago, **columns)
    with pytest.raises(weft.UnusableScheduleError) as caught:
        handle.resume()
    _assert_names_the_row(caught.value, column)
    assert Schedule.objects.get(pk="odd").paused


@pytest.mark.parametrize("name", list(BAD_ARGUMENTS))
def test_trigger_and_describe_of_a_row_with_undecodable_arguments_name_the_column(name):
    handle = weft.schedule("tests.scheduled_run", id="odd", every=60)
    Schedule.objects.filter(pk="odd").update(**BAD_ARGUMENTS[name])
    column = "kwargs" if name == "kwargs" else "args"
    for call in (handle.trigger, handle.describe):
        with pytest.raises(weft.UnusableScheduleError) as caught:
            call()
        _assert_names_the_row(caught.value, column)
    assert not Workflow.objects.filter(schedule_id="odd").exists()


def test_update_replaces_undecodable_arguments_without_reading_them():
    handle = weft.schedule("tests.scheduled_run", id="odd", every=60)
    Schedule.objects.filter(pk="odd").update(args="{not json", kwargs="{also not json")
    handle.update(args=[1], kwargs={"label": "fixed"})
    described = handle.describe()
    assert (described["args"], described["kwargs"]) == ([1], {"label": "fixed"})


def test_update_keeping_an_undecodable_column_says_which():
    handle = weft.schedule("tests.scheduled_run", id="odd", every=60)
    Schedule.objects.filter(pk="odd").update(kwargs="{not json")
    with pytest.raises(weft.UnusableScheduleError) as caught:
        handle.update(args=[1])
    _assert_names_the_row(caught.value, "kwargs")
    handle.update(kwargs={})  # the args column decodes: only the broken one needs replacing
    assert handle.describe()["kwargs"] == {}


def test_a_new_schedule_with_a_never_matching_cron_is_still_an_argument_error():
    with pytest.raises(weft.InvalidScheduleError) as caught:
        weft.schedule("tests.scheduled_run", id="never", cron="0 0 30 2 *")
    assert not isinstance(caught.value, weft.UnusableScheduleError)
    assert "never matches" in str(caught.value)


def test_cli_schedules_json_prints_an_unusable_row_as_its_error_and_the_others_as_usual():
    import json
    from io import StringIO

    from django.core.management import call_command

    weft.schedule("tests.scheduled_run", id="good", every=60)
    weft.schedule("tests.scheduled_run", id="odd", every=60)
    Schedule.objects.filter(pk="odd").update(cron="not a cron", every=None)
    out = StringIO()
    call_command("weft", "schedules", "--json", stdout=out, stderr=StringIO())
    printed = {item["id"]: item for item in json.loads(out.getvalue())}
    assert printed["good"]["every"] == 60
    assert (printed["odd"]["error"]["type"], printed["odd"]["error"]["column"]) == ("UnusableScheduleError", "cron")
