"""The Schedule admin with one hand-edited (odd) row among good ones (docs/admin.md "Odd rows"): a bulk
action applies to the others and reports the odd one with its reason; the change page answers, shows
why the row cannot fire and still lists its active runs; the edit form repairs undecodable args."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import weft_django as weft
from tests.admin.test_admin import ADMIN
from tests.admin.test_admin_actions import messages_of
from weft_django.models import Schedule, Workflow

CHANGELIST = f"{ADMIN}/schedule/"
FAR = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)


def change_url(schedule_id: str) -> str:
    return f"{ADMIN}/schedule/{schedule_id}/change/"


@pytest.fixture
def three(db) -> None:
    for name in ("a-good", "b-bad", "c-good"):
        weft.schedule("tests.scheduled_run", id=name, every=60).pause(note="maintenance")


BAD = {
    "bad-cron": {"cron": "not a cron", "every": None},
    "bad-zone": {"cron": "* * * * *", "every": None, "timezone": "Mars/Olympus"},
    "zero-every": {"every": 0},
}


@pytest.mark.parametrize("name", ["bad-cron", "bad-zone", "zero-every"])
def test_resume_action_with_one_odd_row_reports_it_and_resumes_the_others(admin_client, three, name):
    """Before: HTTP 500 at the odd row, the rows before it resumed, no message."""
    # paused a day ago: resume() has to compute the next occurrence from the row's timing
    day_ago = Schedule.objects.get(pk="b-bad").next_nominal_at - timedelta(days=1)
    Schedule.objects.filter(pk="b-bad").update(**{"next_nominal_at": day_ago, **BAD[name]})
    admin_client.raise_request_exception = False
    response = admin_client.post(
        CHANGELIST,
        {"action": "resume_schedules", "_selected_action": ["a-good", "b-bad", "c-good"], "index": "0"},
        follow=True,
    )
    paused = dict(Schedule.objects.values_list("pk", "paused"))
    assert response.status_code == 200, (response.status_code, paused)
    assert paused == {"a-good": False, "b-bad": True, "c-good": False}
    assert any("b-bad" in text for text in messages_of(response))


def test_trigger_action_with_an_undecodable_args_row_reports_it_and_triggers_the_others(admin_client, three):
    """Before: HTTP 500 (CorruptPayloadError) after "a-good" had started its run."""
    Schedule.objects.filter(pk="b-bad").update(args="{not json")
    admin_client.raise_request_exception = False
    response = admin_client.post(
        CHANGELIST,
        {"action": "trigger_schedules", "_selected_action": ["a-good", "b-bad", "c-good"], "index": "0"},
        follow=True,
    )
    started = sorted(Workflow.objects.values_list("schedule_id", flat=True))
    assert response.status_code == 200, (response.status_code, started)
    assert started == ["a-good", "c-good"]
    assert any("b-bad" in text and "args" in text for text in messages_of(response))


@pytest.mark.parametrize("cron", [None, "0 0 1 1 *"])
def test_change_page_of_a_schedule_with_a_far_next_occurrence_answers(admin_client, three, cron):
    """docs/admin.md "Odd rows": a row edited by hand never takes a page down, and says why it cannot
    fire. Before, for a cron row: croniter's ValueError "year 10000 is out of range" escaped the Cannot
    fire display, and Django's read-only field showed its empty value instead."""
    timing = {"cron": cron, "every": None} if cron else {}
    Schedule.objects.filter(pk="b-bad").update(paused=False, next_nominal_at=FAR, next_fire_at=FAR, **timing)
    admin_client.raise_request_exception = False
    response = admin_client.get(change_url("b-bad"))
    assert response.status_code == 200, response.status_code
    assert "Cannot fire" in response.content.decode() and "next_nominal_at" in response.content.decode()


def test_change_page_of_a_schedule_with_a_bad_cron_says_why_it_cannot_fire(admin_client, three):
    """The fault stays with its row, shown with its reason. Before: "-" for the next fire times and
    "-" for the active runs (Django swallowed the ValueError describe() raised)."""
    weft.get_schedule("b-bad").resume()
    weft.get_schedule("b-bad").trigger()  # an active run, which the page must still list
    Schedule.objects.filter(pk="b-bad").update(cron="not a cron", every=None)
    response = admin_client.get(change_url("b-bad"))
    html = response.content.decode()
    run = Workflow.objects.get(schedule_id="b-bad").pk
    assert (run in html, "not a cron" in html and "invalid" in html.lower()) == (True, True)


def test_schedule_pages_with_a_far_created_at_east_of_utc(admin_client, three, settings):
    """Timestamps a day from year 9999 are shown in UTC, marked, as on the workflow pages (before: 500)."""
    settings.TIME_ZONE = "Asia/Tokyo"
    Schedule.objects.filter(pk="b-bad").update(created_at=FAR, updated_at=FAR, last_fired_at=FAR)
    admin_client.raise_request_exception = False
    statuses = admin_client.get(CHANGELIST).status_code, admin_client.get(change_url("b-bad")).status_code
    assert statuses == (200, 200)


def test_update_can_repair_a_schedule_whose_stored_args_do_not_decode(three):
    """Passing new args and kwargs replaces the stored ones: the old, undecodable text is not needed
    (before: CorruptPayloadError from decoding the stored columns first)."""
    Schedule.objects.filter(pk="b-bad").update(args="{not json", kwargs="{also not json")
    weft.get_schedule("b-bad").update(args=[1], kwargs={"label": "fixed"})
    row = Schedule.objects.get(pk="b-bad")
    assert (row.args, row.kwargs) != ("{not json", "{also not json")


def test_admin_edit_form_can_repair_a_schedule_whose_stored_args_do_not_decode(admin_client, three):
    """The form sends every field to update(), so it replaces the undecodable args (before: 500)."""
    Schedule.objects.filter(pk="b-bad").update(args="{not json")
    admin_client.raise_request_exception = False
    form = {
        "workflow": "tests.scheduled_run",
        "cron": "",
        "every": "60",
        "timezone": "UTC",
        "jitter": "",
        "args": "[]",
        "kwargs": "{}",
        "overlap": "skip",
    }
    response = admin_client.post(change_url("b-bad"), form)
    assert (response.status_code, Schedule.objects.get(pk="b-bad").args) == (302, "[]")
