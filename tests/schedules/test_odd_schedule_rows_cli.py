"""One odd schedule row (edited by hand, or written by an older version) must not take
`weft schedules --json` or the admin's schedule pages down for every schedule."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.utils import timezone

import weft_django as weft
from weft_django.models import Schedule

ADMIN = "/admin/weft_django"


def _row(**fields):
    now = timezone.now()
    values = {
        "workflow_type": "tests.sum",
        "every": 60,
        "args": "[1, 2]",
        "created_at": now,
        "updated_at": now,
        "next_fire_at": now,
        "next_nominal_at": now,
    }
    values.update(fields)
    Schedule.objects.create(id="odd", **values)


ODD = {
    "cron not parseable": {"cron": "not a cron", "every": None},
    "cron that never fires": {"cron": "0 0 31 2 *", "every": None},
    "neither cron nor every": {"every": None},
    "every zero": {"every": 0},
    "args undecodable": {"args": "garbage{"},
    "kwargs undecodable": {"kwargs": "[1"},
    "unknown time zone": {"timezone": "Mars/Olympus"},
}


@pytest.mark.parametrize("case", list(ODD))
def test_weft_schedules_json_lists_the_others_past_an_odd_row(db, case):
    weft.schedule("tests.sum", id="fine", every=60, args=[1, 2])
    _row(**ODD[case])
    out = io.StringIO()
    call_command("weft", "schedules", "--json", stdout=out, stderr=io.StringIO())  # raised for the odd row
    listed = {entry["id"] for entry in json.loads(out.getvalue())}
    assert listed == {"fine", "odd"}


@pytest.mark.parametrize("case", list(ODD))
def test_admin_schedule_pages_show_an_odd_row(admin_client, case):
    _row(**ODD[case])
    for page in (f"{ADMIN}/schedule/", f"{ADMIN}/schedule/odd/change/"):
        response = admin_client.get(page)
        assert response.status_code == 200, (page, response.status_code)
