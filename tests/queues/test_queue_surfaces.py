"""The operators' surfaces of flow control: ``weft doctor`` reports a queue no live engine serves,
``weft queues`` (text and --json), the admin's queues page, and ``weft start --queue``."""

from __future__ import annotations

import contextlib
import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import weft_django as weft
from weft_django.models import Workflow
from weft_django.store import engines

pytestmark = pytest.mark.django_db(transaction=True)
WEFT = {"QUEUES": {"emails": {"concurrency": 3, "rate": "100/m"}, "reports": {"per_engine": 1}}}


def _cli(*args: str) -> str:
    out = StringIO()
    call_command("weft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _doctor_queues() -> dict:
    out = StringIO()
    with contextlib.suppress(CommandError):  # an error finding exits 1
        call_command("weft", "doctor", "--json", stdout=out)
    return next(check for check in json.loads(out.getvalue())["checks"] if check["check"] == "queues")


@override_settings(WEFT=WEFT, SILENCED_SYSTEM_CHECKS=["weft.W003"])
def test_doctor_reports_a_queue_no_live_engine_serves():
    engines.register_engine("only-emails", "automatic", "default", queues=["emails"])
    found = _doctor_queues()
    assert found["level"] == "warning" and "reports: 0 waiting" in found["details"]
    weft.start("tests.queued", queue="reports", id="r-1")
    found = _doctor_queues()
    assert found["level"] == "error" and "reports: 1 waiting" in found["details"]
    engines.register_engine("every-queue", "automatic", "default")
    assert _doctor_queues()["level"] == "ok"


@override_settings(WEFT=WEFT)
def test_weft_queues_lists_depth_running_window_and_keys():
    engines.register_engine("e1", "automatic", "default", queues=["emails"])
    for i in range(3):
        weft.start("tests.queued", queue="emails", concurrency_key=f"k{i % 2}", id=f"m{i}")
    Workflow.objects.filter(pk="m0").update(status="running", admitted_at=Workflow.objects.get(pk="m0").created_at)
    text = _cli("queues")
    assert "emails" in text and "reports" in text and "NO LIVE ENGINE" in text and "k0" in text
    report = json.loads(_cli("queues", "--json"))
    emails = next(row for row in report["queues"] if row["queue"] == "emails")
    assert (emails["waiting"], emails["running"], emails["in_window"], emails["concurrency"]) == (2, 1, 1, 3)
    assert emails["keys"] == [["k0", 1]] and emails["served_by"] == ["e1"]


@override_settings(WEFT=WEFT)
def test_weft_start_takes_queue_options_and_refuses_an_unknown_queue():
    assert "Started" in _cli("start", "tests.queued", "--queue", "emails", "--concurrency-key", "c", "--id", "cli-1")
    row = Workflow.objects.get(pk="cli-1")
    assert (row.queue, row.concurrency_key, row.status) == ("emails", "c", "pending")
    with pytest.raises(CommandError, match="UnknownQueueError"):
        _cli("start", "tests.queued", "--queue", "nope", "--id", "cli-2")
    assert not Workflow.objects.filter(pk="cli-2").exists()


@override_settings(WEFT=WEFT)
def test_admin_queues_page(admin_client):
    weft.start("tests.queued", queue="emails", id="page-1")
    response = admin_client.get("/admin/weft_django/workflow/queues/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "emails" in html and "reports" in html and "no live engine" in html
    changelist = admin_client.get("/admin/weft_django/workflow/").content.decode()
    assert 'href="/admin/weft_django/workflow/queues/"' in changelist
    filtered = admin_client.get("/admin/weft_django/workflow/?queue=emails&status__exact=pending")
    assert filtered.status_code == 200 and [row.pk for row in filtered.context["cl"].result_list] == ["page-1"]
