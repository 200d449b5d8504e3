"""The user-facing test kit (weft_django.testing): in-process and subprocess engines, skipping time for
timers and schedules, freezing an engine past its claims, and the example project's own tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import weft_django as weft
from weft_django.models import Engine, Step, Workflow, WorkflowClaim
from weft_django.testing import FrozenEngine, expire_claims, owns, running_engine, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
FAST = {"WORKFLOW_CLAIM_TTL": "2s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "500ms"}
ROOT = Path(__file__).resolve().parents[2]


def test_run_until_idle_drives_a_workflow_to_its_end(weft_run_until_idle):
    handle = weft.start("tests.sum", args=[2, 3])
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"total": 5}
    assert WorkflowClaim.objects.get(workflow_id=handle.id).engine_id is None  # released on return


def test_clock_skips_a_timer_in_process(weft_run_until_idle, weft_clock):
    handle = weft.start("tests.sleeper", args=[3600])
    weft_run_until_idle()
    assert handle.describe()["status"] == "running"
    before = weft_clock.now()
    weft_clock.advance(3600)
    assert weft_clock.offset().total_seconds() == 3600
    assert (weft_clock.now() - before).total_seconds() >= 3600
    weft_run_until_idle()
    assert handle.result(timeout=5) == "woke"


def test_advance_to_never_goes_backwards(weft_clock):
    start = weft_clock.now()
    weft_clock.advance_to(start.replace(year=start.year - 1))
    assert weft_clock.offset().total_seconds() == 0
    weft_clock.advance_to(start.replace(year=start.year + 1))
    assert weft_clock.now() >= start.replace(year=start.year + 1)


def test_clock_fires_a_due_schedule(weft_run_until_idle, weft_clock):
    schedule = weft.schedule("tests.scheduled_run", id="kit-hourly", every="1h", args=["kit"])
    weft_run_until_idle()
    assert not Workflow.objects.filter(schedule_id="kit-hourly").exists()
    first = schedule.describe()["next_fire_times"][0]
    weft_clock.advance_to(first)
    weft_clock.advance(0.5)
    weft_run_until_idle()
    run_id = f"kit-hourly@{first:%Y-%m-%dT%H:%M:%SZ}"
    assert weft.get_handle(run_id).result(timeout=5) == {"id": run_id, "label": "kit"}


def test_a_background_engine_answers_updates_queries_and_signals(weft_engine):
    counter = weft.start("tests.msg_counter")
    owns(weft_engine, counter.id)
    assert counter.update("add", 3) == 3  # blocks until the engine settles it
    assert counter.query("count") == 3
    waiting = weft.start("tests.signals")
    waiting.signal("go", {"n": 1})
    assert waiting.result(timeout=30) == {"n": 1}


def test_running_engine_releases_its_claims_on_exit():
    handle = weft.start("tests.signals")
    with running_engine("kit-ctx") as engine:
        owns(engine, handle.id)
        assert WorkflowClaim.objects.get(pk=handle.id).engine_id == "kit-ctx"
    assert WorkflowClaim.objects.get(pk=handle.id).engine_id is None


@pytest.mark.subprocess
def test_subprocess_engine_fires_a_timer_once_the_clock_moves(weft_engines, weft_clock):
    handle = weft.start("tests.sleeper", args=[86400])
    engine = weft_engines("kit-timer")
    wait_for(lambda: Workflow.objects.get(pk=handle.id).steps.exists() or handle.describe()["pending_timers"], 30)
    weft_clock.advance(86400)  # the engine sees the offset on its next poll
    assert handle.result(timeout=30) == "woke"
    engine.stop()


@pytest.mark.subprocess
def test_subprocess_engine_fires_a_schedule_once_the_clock_moves(weft_engines, weft_clock):
    schedule = weft.schedule("tests.scheduled_run", id="kit-daily", every="1d", args=["sub"])
    engine = weft_engines("kit-schedules")
    first = schedule.describe()["next_fire_times"][0]
    weft_clock.advance_to(first)
    weft_clock.advance(1)
    run_id = f"kit-daily@{first:%Y-%m-%dT%H:%M:%SZ}"
    wait_for(lambda: Workflow.objects.filter(pk=run_id).exists(), 30, message="the occurrence to fire")
    assert weft.get_handle(run_id).result(timeout=30) == {"id": run_id, "label": "sub"}
    engine.stop()


@pytest.mark.subprocess
def test_freeze_past_claim_waits_on_the_database_clock_then_late_writes_are_refused(weft_engines):
    handle = weft.start("tests.slow", args=["kit-frozen", 2, 1.5])
    zombie = weft_engines("kit-zombie", weft=FAST)
    wait_for(lambda: Step.objects.filter(workflow_id=handle.id).exists() or zombie.claims(), 30, message="claim")
    ttl, grace = zombie.claim_timing()
    assert (ttl.total_seconds(), grace.total_seconds()) == (2.0, 1.0)  # the weft= overrides, as the engine sees them
    frozen = zombie.freeze_past_claim()
    assert set(frozen.claims) == {handle.id}
    claim = WorkflowClaim.objects.get(workflow_id=handle.id)
    from weft_django.store.clock import db_clock

    # Lapsed: past its expiry + grace, or (frozen between a renewal and the heartbeat after it) past its
    # engine's heartbeat + TTL + grace (ADR 0014): any engine may take it over now.
    beat = Engine.objects.get(pk="kit-zombie").heartbeat_at
    assert claim.expires_at + grace < db_clock() or beat + ttl + grace < db_clock()
    weft_engines("kit-rescuer", weft=FAST)
    assert frozen.wait_for_takeover() == {handle.id: "kit-rescuer"}
    frozen.thaw()
    assert handle.result(timeout=60) == ["kit-frozen-0", "kit-frozen-1"]
    assert handle.id in frozen.assert_writes_refused()  # it was mid-activity: its late result was refused


@pytest.mark.subprocess
def test_freeze_past_claim_with_expire_does_not_wait_a_ttl(weft_engines):
    handle = weft.start("tests.signals")
    zombie = weft_engines("kit-zombie-2")  # default 30 s TTL: expire=True skips it
    wait_for(zombie.claims, 30, message="claim")
    frozen = zombie.freeze_past_claim(expire=True)
    weft_engines("kit-rescuer-2")
    assert frozen.wait_for_takeover() == {handle.id: "kit-rescuer-2"}
    weft.get_handle(handle.id).signal("go", "payload")
    assert handle.result(timeout=30) == "payload"
    frozen.assert_writes_refused()


@pytest.mark.subprocess
def test_freezing_an_engine_that_holds_nothing_is_refused(weft_engines):

    idle = weft_engines("kit-idle")
    wait_for(lambda: Engine.objects.filter(pk="kit-idle").exists(), 30, message="engine start")
    with pytest.raises(RuntimeError, match="holds no claim"):
        idle.freeze_past_claim()
    assert idle.process.poll() is None  # thawed again, still running
    assert idle.stop() == 0  # a graceful stop


def test_late_writes_are_detected():
    """The check behind assert_writes_refused is not vacuous: a step written or changed under a frozen
    epoch after the freeze is reported; one under the new epoch is not."""
    from weft_django.store.clock import db_now

    handle = weft.start("tests.sum", args=[1, 1])
    WorkflowClaim.objects.filter(pk=handle.id).update(epoch=7, engine_id="old")
    run_id = Workflow.objects.get(pk=handle.id).run_id
    now = db_now()
    before = Step.objects.create(
        workflow_id=handle.id, run_id=run_id, seq=0, kind="activity", status="running", epoch=7, started_at=now
    )
    engine = SimpleNamespace(alias="default", engine_id="old")
    from weft_django.testing import _step_snapshot

    frozen = FrozenEngine(engine, {handle.id: 7}, _step_snapshot({handle.id: 7}, "default"))  # type: ignore[arg-type]
    assert frozen.late_writes() == []
    Step.objects.filter(pk=before.pk).update(status="completed", result="1", completed_at=now)
    Step.objects.create(
        workflow_id=handle.id, run_id=run_id, seq=1, kind="activity", status="completed", epoch=8, started_at=now
    )
    assert [step.seq for step in frozen.late_writes()] == [0]


def test_expire_claims_selects_an_engine_or_workflows():
    for wid, holder in (("e-1", "a"), ("e-2", "a"), ("e-3", "b")):
        weft.start("tests.sum", args=[1, 1], id=wid)
        WorkflowClaim.objects.filter(pk=wid).update(engine_id=holder, expires_at="2999-01-01T00:00:00Z")
    assert expire_claims("a", workflow_ids=["e-1"]) == 1
    assert expire_claims("a") == 2
    assert expire_claims(workflow_ids=["e-3"]) == 1
    assert WorkflowClaim.objects.filter(expires_at__year=2000).count() == 3


def test_the_plugin_is_registered_by_entry_point():
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="pytest11") if e.name == "weft_django"] == ["weft_django.testing"]


@pytest.mark.subprocess
def test_the_example_projects_own_tests_pass():
    """example_project/shop/tests is what docs/testing.md shows users; it runs here on this run's database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if os.environ.get("WEFT_TEST_DB", "postgres") == "sqlite":
        base = os.environ.get("WEFT_SQLITE_PATH", "/tmp/weft-tests.sqlite3")
        env["DATABASE_URL"] = f"sqlite:///{base}.example"
        env["EXAMPLE_SQLITE_TEST_PATH"] = f"{base}.example-test"
    else:
        user = os.environ.get("WEFT_PG_USER", "postgres")
        host = os.environ.get("WEFT_PG_HOST", "127.0.0.1")
        port = os.environ.get("WEFT_PG_PORT", "5432")
        env["DATABASE_URL"] = f"postgres://{user}@{host}:{port}/{os.environ.get('WEFT_PG_NAME', 'weft')}_example"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "example_project",
            "--ds=example_project.test_settings",
            "-p",
            "no:cacheprovider",
            "-q",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout
