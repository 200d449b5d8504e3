"""A schedule's time zone is an IANA name, the same zone on every engine: not a key whose zone the
machine decides ("localtime", the machine's own zone; "posixrules", chosen per installation; the
"posix/" and "right/" copies some machines lack). Refused when a schedule is made or updated; a stored
row with one is unusable (its fault stays with it: the pass fires the others, the admin says why).

Each test says which zone each key is on "this machine" (tests/machine_zones.py)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest

import weft_django as weft
from tests.admin.test_admin_schedule_odd_rows import change_url
from tests.machine_zones import machine_zones
from weft_django.conf import get_settings
from weft_django.engine import schedules as firing
from weft_django.models import Schedule, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

MACHINE = {
    "localtime": "Asia/Tokyo",
    "posixrules": "America/New_York",
    "posix/Europe/Berlin": "Europe/Berlin",
    "right/Europe/Berlin": "Europe/Berlin",
}


@pytest.fixture
def machine(tmp_path):
    with machine_zones(tmp_path, MACHINE):
        yield


@pytest.mark.parametrize("key", list(MACHINE))
def test_a_zone_the_machine_decides_is_refused_when_a_schedule_is_made_or_updated(machine, key):
    for zone in (key, ZoneInfo(key)):
        with pytest.raises(weft.InvalidScheduleError) as caught:
            weft.schedule("tests.scheduled_run", id="zoned", cron="30 2 * * *", timezone=zone)
        assert not isinstance(caught.value, weft.UnusableScheduleError)
        text = str(caught.value)
        assert repr(key) in text and "IANA" in text, text
    assert not Schedule.objects.filter(pk="zoned").exists()
    handle = weft.schedule("tests.scheduled_run", id="zoned", cron="30 2 * * *", timezone="Europe/Berlin")
    with pytest.raises(weft.InvalidScheduleError):
        handle.update(timezone=key)
    assert Schedule.objects.get(pk="zoned").timezone == "Europe/Berlin"


@pytest.mark.parametrize("key", list(MACHINE))
def test_a_stored_row_in_a_zone_the_machine_decides_is_unusable_and_the_pass_fires_the_others(
    machine, key, weft_clock, admin_client
):
    weft.schedule("tests.scheduled_run", id="bad", every=60, overlap="allow")
    weft.schedule("tests.scheduled_run", id="good", every=60, overlap="allow")
    weft_clock.advance(60)
    due = {"next_nominal_at": weft_clock.now() - timedelta(seconds=1), "next_fire_at": weft_clock.now()}
    Schedule.objects.filter(pk="bad").update(cron="* * * * *", every=None, timezone=key, **due)
    Schedule.objects.filter(pk="good").update(**due)
    firing.ScheduleFiring().run(SimpleNamespace(using="default", settings=get_settings()), weft_clock.now())
    fired = {name: Workflow.objects.filter(schedule_id=name).count() for name in ("bad", "good")}
    assert fired == {"bad": 0, "good": 1}
    bad = Schedule.objects.get(pk="bad")
    assert (bad.next_nominal_at, bad.next_fire_at, bad.missed_fire_count) == (*due.values(), 0)
    with pytest.raises(weft.UnusableScheduleError) as caught:
        weft.get_schedule("bad").describe()
    assert (caught.value.schedule_id, caught.value.column) == ("bad", "timezone")
    assert repr(key) in str(caught.value) and "update(timezone=...)" in str(caught.value)
    html = admin_client.get(change_url("bad")).content.decode()
    assert "Cannot fire" in html and "its timezone" in html, html
