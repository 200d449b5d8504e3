"""Issue 21 item 8: one odd row (edited by hand, or written by another version) never takes an
admin page or a ``manage.py weft`` command down. A timestamp near year 9999 (in year 10000 in a time
zone east of UTC), an unknown status, undecodable payloads, an error that is not a JSON object, a
step of an unknown kind: the admin's workflow list, change page (with its timeline), timer, claim
and signal pages, the ownership and terminal pages, and ``weft list`` / ``weft describe`` answer,
showing the row marked as odd, instead of a 500 or exit 1."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

import weft_django as weft
from weft_django.models import BufferedSignal, Step, Timer, Workflow, WorkflowClaim
from weft_django.status import StepKind, StepStatus, TimerKind

ADMIN = "/admin/weft_django"
FAR = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)  # 10000-01-01 08:59:59 in Tokyo


@weft.workflow(name="odd_rows.waits")
def waits(ctx, *args, **kwargs):
    yield ctx.wait_for_signal("go")


def _far_times(workflow_id: str) -> None:
    run = Workflow.objects.get(pk=workflow_id)
    Workflow.objects.filter(pk=workflow_id).update(
        status="pending", start_at=FAR, execution_deadline=FAR, started_at=FAR, updated_at=FAR, created_at=FAR
    )
    Timer.objects.create(workflow_id=workflow_id, run_id=run.run_id, kind=TimerKind.DELAYED_START, fire_at=FAR)
    WorkflowClaim.objects.filter(pk=workflow_id).update(expires_at=FAR, claimed_at=FAR, engine_id="engine-far")
    BufferedSignal.objects.filter(workflow_id=workflow_id).update(created_at=FAR)


def _far_step(workflow_id: str) -> None:
    run = Workflow.objects.get(pk=workflow_id)
    Step.objects.create(
        run_id=run.run_id,
        workflow_id=workflow_id,
        seq=0,
        kind=StepKind.SLEEP,
        name="",
        status=StepStatus.COMPLETED,
        epoch=1,
        started_at=FAR,
        completed_at=FAR,
    )


def _finished_far(workflow_id: str) -> None:
    Workflow.objects.filter(pk=workflow_id).update(status="completed", result="1", finished_at=FAR)


def _unknown_status(workflow_id: str) -> None:
    Workflow.objects.filter(pk=workflow_id).update(status="exploded")


def _bad_payloads(workflow_id: str) -> None:
    Workflow.objects.filter(pk=workflow_id).update(input="not json", status="completed", result="garbage")
    BufferedSignal.objects.filter(workflow_id=workflow_id).update(payload="{")


def _error_not_a_dict(workflow_id: str) -> None:
    Workflow.objects.filter(pk=workflow_id).update(status="failed", error="a string", stuck_error=["a", "list"])


def _odd_step(workflow_id: str) -> None:
    run = Workflow.objects.get(pk=workflow_id)
    Step.objects.create(
        run_id=run.run_id,
        workflow_id=workflow_id,
        seq=0,
        kind="bogus",
        name="x",
        status="weird",
        epoch=1,
        started_at=timezone.now(),
        error="just text",
    )


# name -> (how the row is made odd, what the change page shows, what `weft describe` shows)
ODD = {
    "far-times": (_far_times, "out of range", "UTC (out of range)"),
    "far-step": (_far_step, "out of range", "far-step"),
    "finished-far": (_finished_far, "out of range", "UTC (out of range)"),
    "unknown-status": (_unknown_status, "exploded (unknown status)", "exploded (unknown status)"),
    "bad-payloads": (_bad_payloads, "Corrupt payload", "completed"),
    "error-not-a-dict": (_error_not_a_dict, "not an error object", '"a string" (not an error object)'),
    "odd-step": (_odd_step, "#0 bogus x", "odd-step"),
}


@pytest.fixture(autouse=True)
def _east_of_utc(settings):
    """Times shown in a zone ahead of UTC: 9999-12-31 23:59:59 UTC is in year 10000 there."""
    settings.TIME_ZONE = "Asia/Tokyo"


def _odd_run(name: str) -> str:
    weft.start("odd_rows.waits", id=name)
    weft.signal(name, "go", {"n": 1})
    ODD[name][0](name)
    return name


def _cli(*args: str) -> str:
    out = StringIO()
    call_command("weft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.parametrize("name", list(ODD))
def test_admin_pages_show_an_odd_row(admin_client, name):
    workflow_id = _odd_run(name)
    weft.start("odd_rows.waits", id="ordinary")
    pages = [
        f"{ADMIN}/workflow/",
        f"{ADMIN}/workflow/?status=completed",
        f"{ADMIN}/workflow/{workflow_id}/change/",
        f"{ADMIN}/timer/",
        f"{ADMIN}/workflowclaim/",
        f"{ADMIN}/workflowclaim/{workflow_id}/change/",
        f"{ADMIN}/bufferedsignal/",
        f"{ADMIN}/workflow/ownership/",
        f"{ADMIN}/workflow/terminal/",
    ]
    pages += [f"{ADMIN}/timer/{pk}/change/" for pk in Timer.objects.filter(workflow_id=workflow_id).values_list("pk")]
    pages += [
        f"{ADMIN}/bufferedsignal/{pk}/change/"
        for pk in BufferedSignal.objects.filter(workflow_id=workflow_id).values_list("pk", flat=True)
    ]
    pages = [page.replace("(", "").replace(",)", "") for page in pages]
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, (page, response.status_code)
    change = admin_client.get(f"{ADMIN}/workflow/{workflow_id}/change/").content.decode()
    assert ODD[name][1] in change
    assert workflow_id in admin_client.get(f"{ADMIN}/workflow/").content.decode()


@pytest.mark.parametrize("name", list(ODD))
def test_cli_lists_and_describes_an_odd_row(db, name):
    workflow_id = _odd_run(name)
    assert workflow_id in _cli("list")
    assert workflow_id in {row["id"] for row in json.loads(_cli("list", "--json"))}
    assert ODD[name][2] in _cli("describe", workflow_id)
    assert json.loads(_cli("describe", workflow_id, "--json"))["id"] == workflow_id


def test_describe_and_status_return_an_unknown_status_as_stored(db):
    _odd_run("unknown-status")
    handle = weft.get_handle("unknown-status")
    assert handle.describe()["status"] == "exploded"
    assert handle.status == "exploded"
