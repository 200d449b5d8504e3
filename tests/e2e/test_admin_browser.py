"""The operator's tour in real headless Chromium: log in, watch two engines own workflows, cancel one,
signal another, read a step timeline and a failure, and the terminal-states page.

The engines are real ``weft_engine`` subprocesses on the test database; the admin is served by
pytest-django's ``live_server``. Screenshots: see conftest.py (docs/images holds the committed ones).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

import weft_django as weft
from weft_django.models import BufferedSignal, Engine, Step, Workflow, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.subprocess,
    pytest.mark.postgres,  # once is enough: the SQLite run skips it
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

WAIT = 30.0


def _by(kind: str) -> Any:
    from selenium.webdriver.common.by import By

    return getattr(By, kind)


def _wait(browser: Any, predicate: Any, timeout: float = WAIT) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout).until(predicate)


def _open(browser: Any, url: str, ready_selector: str = "#content") -> None:
    browser.get(url)
    _wait(browser, lambda d: d.find_elements(_by("CSS_SELECTOR"), ready_selector))


def _shot(browser: Any, directory: Path, name: str, height: int | None = None) -> Path:
    """A PNG of the page; the window grows to the page height (up to 2400 px) so nothing is cut."""
    page_height = browser.execute_script(
        "const c = document.getElementById('container');"
        "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight, c ? c.scrollHeight : 0)"
        " + (window.outerHeight - window.innerHeight);"
    )
    browser.set_window_size(1600, min(max(height or page_height, 600), 2400))
    path = directory / name
    browser.save_screenshot(str(path))
    browser.set_window_size(1600, 1000)
    return path


def _login(browser: Any, base: str) -> None:
    _open(browser, f"{base}/admin/login/?next=/admin/", "#login-form")
    browser.find_element(_by("NAME"), "username").send_keys("admin")
    browser.find_element(_by("NAME"), "password").send_keys("password")
    browser.find_element(_by("CSS_SELECTOR"), "#login-form input[type=submit]").click()
    _wait(browser, lambda d: "/admin/login" not in d.current_url)
    # Fold the navigation sidebar (Django remembers it in localStorage): more room for the tables.
    browser.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")


def _start_runs() -> None:
    with transaction.atomic():  # one commit: both engines wake up to the same batch
        for i in range(1, 7):
            weft.start("tests.cancellable", id=f"order-{i}")
        weft.start("tests.slow", args=["tour", 4, 0.4], id="slow-pipeline")
        weft.start("tests.retrying", args=["tour", 2], id="flaky-call")
        weft.start("tests.replay_check", id="awaiting-approval")
        weft.start("tests.sleeper", args=[3600], id="cooling-off")
        weft.start("tests.uncaught_activity_error", args=["tour"], id="broken-import")
        weft.start("tests.three_steps", args=["tour"], id="three-steps")


def test_operator_tour(browser: Any, live_server: Any, admin_user: Any, weft_engines: Any, screenshots: Path) -> None:
    # Small claim batches, so the two engines share the work instead of the first one taking it all.
    small_batches = {"WEFT_TEST_OVERRIDES": json.dumps({"CLAIM_BATCH_SIZE": 2})}
    engines = [weft_engines("engine-a", env=small_batches), weft_engines("engine-b", env=small_batches)]
    wait_for(lambda: Engine.objects.filter(stopped_at__isnull=True).count() == 2, WAIT, message="two engines")
    _start_runs()
    wait_for(lambda: Step.objects.filter(workflow_id="slow-pipeline", status="completed").count() == 4, WAIT)
    wait_for(lambda: Workflow.objects.filter(id="broken-import", status="failed").exists(), WAIT)
    wait_for(lambda: WorkflowClaim.objects.filter(engine_id__isnull=False).count() >= 8, WAIT, message="claims")
    base = live_server.url
    _login(browser, base)

    # Ownership: both engines alive, the claims they hold.
    _open(browser, f"{base}/admin/weft_django/workflow/ownership/", "#weft-engines")
    engines_table = browser.find_element(_by("ID"), "weft-engines").text
    for engine in engines:
        assert engine.engine_id in engines_table
    assert engines_table.count("alive") >= 2
    claims_table = browser.find_element(_by("ID"), "weft-claims").text
    assert "order-1" in claims_table and "held" in claims_table
    _shot(browser, screenshots, "admin-ownership.png")

    # The changelist: badges, owners, epochs, claim expiry.
    _open(browser, f"{base}/admin/weft_django/workflow/", "#result_list")
    assert browser.find_elements(_by("CSS_SELECTOR"), "#result_list .weft-status-running")
    assert browser.find_elements(_by("CSS_SELECTOR"), "#result_list .weft-status-failed")
    _shot(browser, screenshots, "admin-workflows.png")

    # Cancel order-1 with the changelist action (on the list filtered by a search).
    from selenium.webdriver.support.ui import Select

    _open(browser, f"{base}/admin/weft_django/workflow/?q=order-", "#result_list")
    browser.find_element(_by("CSS_SELECTOR"), "input.action-select[value='order-1']").click()
    Select(browser.find_element(_by("NAME"), "action")).select_by_value("cancel_workflows")
    browser.find_element(_by("CSS_SELECTOR"), "button[name=index]").click()
    message = _wait(browser, lambda d: d.find_elements(_by("CSS_SELECTOR"), "ul.messagelist li.success"))[0].text
    assert 'Cancelled 1 workflow: "order-1".' in message
    assert Workflow.objects.get(id="order-1").status == "cancelled"
    assert (
        "order-1"
        in browser.find_element(_by("CSS_SELECTOR"), "#result_list .weft-status-cancelled")
        .find_element(_by("XPATH"), "ancestor::tr")
        .text
    )
    _shot(browser, screenshots, "admin-cancelled.png")

    # Signal awaiting-approval from its change page; its timeline then shows the wait it ended.
    _open(browser, f"{base}/admin/weft_django/workflow/awaiting-approval/change/", "#weft-timeline")
    browser.find_element(_by("CSS_SELECTOR"), "a.weft-act-signal").click()
    _wait(browser, lambda d: d.find_elements(_by("ID"), "id_name"))
    browser.find_element(_by("ID"), "id_name").send_keys("continue")
    browser.find_element(_by("ID"), "id_payload").send_keys('{"approved_by": "ops"}')
    browser.find_element(_by("NAME"), "_send").click()
    message = _wait(browser, lambda d: d.find_elements(_by("CSS_SELECTOR"), "ul.messagelist li.success"))[0].text
    assert 'Sent signal "continue" to 1 workflow' in message
    assert BufferedSignal.objects.filter(workflow_id="awaiting-approval", name="continue").exists()
    wait_for(lambda: Workflow.objects.get(id="awaiting-approval").status == "completed", WAIT)
    _open(browser, f"{base}/admin/weft_django/workflow/awaiting-approval/change/", "#weft-timeline")
    kinds = [
        bar.get_attribute("class")
        for bar in browser.find_elements(_by("CSS_SELECTOR"), "#weft-timeline .weft-tl-track .weft-bar")
    ]
    assert "weft-kind-activity" in kinds[0] and "weft-kind-signal" in kinds[1]
    assert "{'approved_by': 'ops'}" in browser.find_element(_by("ID"), "weft-signals").text
    timeline = browser.find_element(_by("ID"), "weft-timeline")
    browser.execute_script("arguments[0].scrollIntoView()", timeline)
    timeline.screenshot(str(screenshots / "admin-timeline-signal.png"))

    # The step timeline: one bar per step, on a time axis.
    _open(browser, f"{base}/admin/weft_django/workflow/slow-pipeline/change/", "#weft-timeline")
    bars = browser.find_elements(_by("CSS_SELECTOR"), "#weft-timeline .weft-tl-track .weft-bar")
    assert len(bars) == 4
    lefts = [float(bar.value_of_css_property("left").removesuffix("px")) for bar in bars]
    assert lefts == sorted(lefts) and lefts[0] < lefts[-1]  # consecutive steps move right on the axis
    timeline = browser.find_element(_by("ID"), "weft-timeline")
    browser.execute_script("arguments[0].scrollIntoView()", timeline)
    timeline.screenshot(str(screenshots / "admin-timeline.png"))

    _open(browser, f"{base}/admin/weft_django/workflow/flaky-call/change/", "#weft-timeline")
    assert "3 attempts" in browser.find_element(_by("ID"), "weft-timeline").text
    _open(browser, f"{base}/admin/weft_django/workflow/cooling-off/change/", "#weft-timeline")
    assert browser.find_elements(_by("CSS_SELECTOR"), "#weft-timeline .weft-kind-timer.weft-bar-pending")
    _shot(browser, screenshots, "admin-detail-sleeping.png")

    # A failure: the error with its traceback, and the failing step in red.
    _open(browser, f"{base}/admin/weft_django/workflow/broken-import/change/", "#weft-timeline")
    assert "ValueError: bad input" in browser.find_element(_by("CSS_SELECTOR"), ".weft-error").text
    assert browser.find_elements(_by("CSS_SELECTOR"), "#weft-timeline .weft-bar-failed")
    _shot(browser, screenshots, "admin-detail-failed.png")

    _open(browser, f"{base}/admin/weft_django/workflow/terminal/", "#weft-days")
    assert "broken-import" in browser.find_element(_by("ID"), "weft-failures").text
    _shot(browser, screenshots, "admin-terminal.png")
