"""Rows edited by hand or left by an older version that still
keep an engine busy forever, strand a run silently, or break `weft doctor`."""

from __future__ import annotations

import contextlib
import io
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

import weft_django as weft
from weft_django.models import ClockOffset, Timer, Workflow, WorkflowClaim
from weft_django.testing import run_until_idle, running_engine

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.odd_rows.waits")
def waits(ctx):
    value = yield ctx.wait_for_signal("go")
    return value


def _doctor() -> str:
    out = io.StringIO()
    with contextlib.suppress(CommandError):  # unhealthy: exit 1 with its report printed
        call_command("weft", "doctor", stdout=out, stderr=out)
    return out.getvalue()


def test_a_stale_activity_retry_timer_does_not_keep_the_engine_busy_forever():
    """A retry timer for a step that is not waiting for a retry (seq 5 of a run parked at seq 0) is
    kept in the context's timers, never taken (progress.on_timer ignores it) and counted by
    Progress.processing() as an attempt waiting out its back-off: run_until_idle and
    `weft_engine --once` never end."""
    weft.start("tests.odd_rows.waits", id="bad")
    run_until_idle(timeout=20)
    run_id = Workflow.objects.get(pk="bad").run_id
    Timer.objects.create(
        workflow_id="bad", run_id=run_id, kind="activity_retry", seq=5, attempt=2, fire_at=timezone.now()
    )
    good = weft.start("tests.sum", args=[2, 3], id="good")
    run_until_idle(timeout=10)  # TimeoutError: still busy after 10s
    assert good.result(timeout=1) == {"total": 5}


def test_a_stuck_count_at_its_column_maximum_still_shows_why_the_run_is_stuck():
    """stuck_attempts + 1 overflows the integer column: the stuck mark is refused, then the
    EngineInternalError mark too (same count), the workflow is dropped with no reason recorded and
    retried each time its claim lapses."""
    weft.start("tests.odd_rows.waits", id="bad")
    run_until_idle(timeout=20)
    Workflow.objects.filter(pk="bad").update(stuck_attempts=2147483647, version="999")  # a version not deployed
    good = weft.start("tests.sum", args=[2, 3], id="good")
    run_until_idle(timeout=20)
    assert good.result(timeout=1) == {"total": 5}
    row = Workflow.objects.get(pk="bad")
    assert row.stuck_error is not None, "the run is stuck, but nothing says so"


def test_a_running_workflow_without_its_claim_is_run_or_reported():
    """No claim row: no engine ever acquires it (acquire scans claims only) and nothing reports it:
    `weft doctor` is healthy with an engine alive while the run never moves."""
    weft.start("tests.sum", args=[1, 2], id="bad")
    WorkflowClaim.objects.filter(pk="bad").delete()
    with running_engine("odd-engine"):
        good = weft.start("tests.sum", args=[2, 3], id="good")
        assert good.result(timeout=20) == {"total": 5}
        time.sleep(1.5)
        report = _doctor()
    status = Workflow.objects.get(pk="bad").status
    assert status == "completed" or "bad" in report, (status, report)


def test_doctor_reports_a_clock_offset_past_year_9999_instead_of_raising():
    """ClockOffset is one row (workflow time = database time + offset): an offset that puts workflow
    time past year 9999 makes every engine tick fail, and `weft doctor` itself dies with DataError."""
    ClockOffset.objects.update_or_create(id=1, defaults={"offset_ms": 10**15})
    report = _doctor()
    assert "offset" in report.lower() or "clock" in report.lower()
