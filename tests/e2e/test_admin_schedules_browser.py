"""Schedules in real headless Chromium: create one through the admin's form (a bad cron is refused
with weft's message first), see it in the list, pause it from its page.

Screenshots: see conftest.py (docs/images holds the committed ones).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import weft_django as weft
from tests.e2e.test_admin_browser import _by, _login, _open, _shot, _wait
from weft_django.models import Schedule

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,  # once is enough: the SQLite run skips it
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


def _fill(browser: Any, values: dict[str, str]) -> None:
    for name, value in values.items():
        field = browser.find_element(_by("NAME"), name)
        field.clear()
        field.send_keys(value)


def test_create_and_pause_a_schedule(browser: Any, live_server: Any, admin_user: Any, screenshots: Path) -> None:
    weft.schedule("tests.scheduled_run", id="hourly-sync", every="1h", overlap="allow")
    weft.schedule("tests.scheduled_run", id="weekly-digest", cron="0 8 * * MON", timezone="America/New_York")
    weft.schedule("tests.scheduled_run", id="ledger-close", cron="@daily", jitter="10m").pause(note="migration")
    base = live_server.url
    _login(browser, base)

    _open(browser, f"{base}/admin/weft_django/schedule/add/", "#schedule_form")
    _fill(
        browser,
        {
            "id": "nightly-report",
            "workflow": "tests.scheduled_run",
            "cron": "30 25 * * *",
            "timezone": "Europe/Berlin",
            "kwargs": '{"label": "nightly"}',
        },
    )
    browser.find_element(_by("NAME"), "_save").click()
    _wait(browser, lambda d: d.find_elements(_by("CSS_SELECTOR"), ".errornote"))
    error = browser.find_element(_by("CSS_SELECTOR"), ".field-cron .errorlist").text
    assert "is not a valid cron expression" in error
    assert not Schedule.objects.filter(pk="nightly-report").exists()
    _shot(browser, screenshots, "admin-schedule-form.png")

    _fill(browser, {"cron": "30 2 * * *"})
    browser.find_element(_by("NAME"), "_save").click()
    _wait(browser, lambda d: d.current_url.endswith("/admin/weft_django/schedule/"))
    assert "nightly-report" in browser.find_element(_by("ID"), "result_list").text
    described = weft.get_schedule("nightly-report").describe()
    assert described["cron"] == "30 2 * * *" and described["timezone"] == "Europe/Berlin"
    assert described["kwargs"] == {"label": "nightly"} and len(described["next_fire_times"]) == 5
    _shot(browser, screenshots, "admin-schedules.png")

    _open(browser, f"{base}/admin/weft_django/schedule/nightly-report/change/", "#schedule_form")
    assert "TRIGGER NOW" in browser.find_element(_by("CSS_SELECTOR"), ".object-tools").text.upper()
    _shot(browser, screenshots, "admin-schedule-detail.png")
    browser.find_element(_by("CSS_SELECTOR"), "button.weft-act-pause").click()
    _wait(browser, lambda d: d.find_elements(_by("CSS_SELECTOR"), "button.weft-act-resume"))
    assert 'Paused 1 schedule: "nightly-report".' in browser.find_element(_by("CSS_SELECTOR"), ".messagelist").text
    assert Schedule.objects.get(pk="nightly-report").paused
