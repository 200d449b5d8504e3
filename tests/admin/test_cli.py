"""manage.py weft: every subcommand through call_command (text and --json), bad input refused before
anything is written, confirmations, doctor's findings and exit codes; and the command as a real
subprocess against the test database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

import weft_django as weft
from tests.admin.test_admin import hold
from weft_django.client import WorkflowHandle
from weft_django.management.commands.weft import DESCRIBE_KEYS, table
from weft_django.models import BufferedSignal, Engine, Schedule, Timer, Workflow
from weft_django.status import TimerKind
from weft_django.store.clock import db_clock, db_now
from weft_django.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]


def weft_cli(*args: str) -> str:
    out = StringIO()
    call_command("weft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def weft_json(*args: str):
    return json.loads(weft_cli(*args, "--json"))


@pytest.fixture
def runs(db):
    weft.start("admin_tests.waits", id="alpha", args=[1])
    weft.start("admin_tests.waits", id="beta")
    weft.start("tests.sum", id="gamma", args=[1, 2])
    Workflow.objects.filter(pk="gamma").update(status="completed", result="3", finished_at=db_now())
    hold("alpha", engine_id="engine-cli")
    return ["alpha", "beta", "gamma"]


def test_table_aligns_columns():
    assert table(("A", "LONG"), [("xyz", None), ("x", 12)]).splitlines() == ["A    LONG", "xyz  -", "x    12"]


# ----------------------------------------------------------------------------------------- reading


def test_list_text_and_json(runs):
    text = weft_cli("list")
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "TYPE", "STATUS", "OWNER", "EPOCH", "CLAIM", "EXPIRES", "STEP", "CREATED"]
    assert any(line.startswith("alpha") and "engine-cli" in line for line in lines)
    assert "3 workflow(s) shown" in text
    rows = weft_json("list")
    assert [row["id"] for row in rows] == ["gamma", "beta", "alpha"]  # newest first
    assert all(tuple(row) == DESCRIBE_KEYS for row in rows)
    alpha = next(row for row in rows if row["id"] == "alpha")
    described = weft.get_handle("alpha").describe()
    assert alpha["owner_engine"] == "engine-cli" and alpha["epoch"] == described["epoch"]
    assert alpha["claim_expires_at"] == described["claim_expires_at"].isoformat()


def test_list_filters(runs):
    assert [r["id"] for r in weft_json("list", "--status", "completed")] == ["gamma"]
    assert {r["id"] for r in weft_json("list", "--status", "running", "--status", "completed")} == set(runs)
    assert [r["id"] for r in weft_json("list", "--type", "tests.sum")] == ["gamma"]
    assert len(weft_json("list", "--limit", "1")) == 1
    assert weft_cli("list", "--type", "nothing.here").strip() == "No workflows match."
    with pytest.raises(CommandError, match="invalid choice: 'finished'"):
        weft_cli("list", "--status", "finished")
    with pytest.raises(CommandError, match="whole number from 1 to"):
        weft_cli("list", "--limit", "0")


def test_describe_text_and_json(runs):
    data = weft_json("describe", "alpha")
    described = weft.get_handle("alpha").describe()
    assert list(data) == list(described)
    assert data["run_id"] == str(described["run_id"]) and data["owner_engine"] == "engine-cli"
    text = weft_cli("describe", "alpha")
    assert "owner_engine      engine-cli" in text
    Workflow.objects.filter(pk="beta").update(
        status="failed", error={"type": "ValueError", "message": "bad input"}, finished_at=db_now()
    )
    assert "error             ValueError: bad input" in weft_cli("describe", "beta")
    with pytest.raises(CommandError, match='WorkflowNotFoundError: No workflow "nope" exists'):
        weft_cli("describe", "nope")


def test_engines_and_claims(runs):
    Engine.objects.create(
        id="engine-gone", host="h", pid=1, mode="workflow-lease", started_at=db_clock(), heartbeat_at=db_clock()
    )
    Engine.objects.filter(id="engine-gone").update(heartbeat_at=db_clock() - timedelta(hours=1))
    text = weft_cli("engines")
    assert text.splitlines()[0].split()[:3] == ["ENGINE", "STATE", "HOST"]
    engines = {row["id"]: row for row in weft_json("engines")}
    assert engines["engine-cli"]["state"] == "alive" and engines["engine-cli"]["claims_held"] == 1
    assert engines["engine-gone"]["state"] == "dead"
    claims = weft_json("claims")
    assert [(c["workflow_id"], c["engine_id"], c["lapsed"]) for c in claims] == [("alpha", "engine-cli", False)]
    assert "alpha" in weft_cli("claims") and "engine-cli" in weft_cli("claims")
    assert {c["workflow_id"] for c in weft_json("claims", "--all")} == set(runs)


def test_schedules(db, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "weft_django.schedules" else real(name, *a)
    )
    assert weft_cli("schedules").strip() == "no schedules module yet"
    monkeypatch.undo()
    if real("weft_django.schedules") is None:
        return
    assert weft_cli("schedules").strip() == "No schedules."
    Schedule.objects.create(
        id="nightly", workflow_type="tests.sum", every=3600, created_at=db_now(), updated_at=db_now()
    )
    line = weft_cli("schedules").splitlines()[1]
    assert line.split()[:4] == ["nightly", "tests.sum", "every", "3600s"]


# ----------------------------------------------------------------------------------------- acting


def test_start(db):
    text = weft_cli("start", "tests.sum", "--args", "[2, 3]", "--id", "from-cli")
    assert text.strip() == 'Started tests.sum as "from-cli" (running).'
    assert Workflow.objects.get(pk="from-cli").input == '{"args":[2,3],"kwargs":{}}'
    data = weft_json("start", "admin_tests.waits", "--kwargs", '{"amount": {"$weft": "decimal", "v": "1.50"}}')
    assert data["workflow_type"] == "admin_tests.waits" and data["status"] == "running"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tests.sum", "--args", "[1,"], "--args is not valid JSON"),
        (["tests.sum", "--args", '{"a": 1}'], "--args must be a JSON list"),
        (["tests.sum", "--kwargs", "[1]"], "--kwargs must be a JSON object"),
        (["tests.sum", "--args", "[NaN]"], "NaN is not valid codec output"),
        (["tests.sum", "--args", '[{"$weft": "nope", "v": 1}]'], "cannot be used: malformed tagged value|tag"),
        (["no.such.workflow"], 'WorkflowNotRegisteredError: No workflow "no.such.workflow" is registered'),
        (["tests.sum", "--id", ""], "InvalidWorkflowIdError"),
    ],
)
def test_start_refuses_bad_input_and_writes_nothing(db, args, message):
    with pytest.raises(CommandError, match=message):
        weft_cli("start", *args)
    assert not Workflow.objects.exists()


def test_start_an_existing_id(runs):
    with pytest.raises(CommandError, match='WorkflowAlreadyExistsError: Workflow "alpha" already exists'):
        weft_cli("start", "admin_tests.waits", "--id", "alpha")


def test_signal(runs):
    assert weft_cli("signal", "alpha", "go", "--payload", '{"n": 1}').strip() == 'Signal "go" sent to "alpha".'
    assert weft_json("signal", "beta", "go", "--signal-id", "s1") == {"id": "beta", "signal": "go", "sent": True}
    assert BufferedSignal.objects.count() == 2
    with pytest.raises(CommandError, match="--payload is not valid JSON"):
        weft_cli("signal", "alpha", "go", "--payload", "{oops}")
    with pytest.raises(CommandError, match="WorkflowTerminalError"):
        weft_cli("signal", "gamma", "go")
    with pytest.raises(CommandError, match="WorkflowNotFoundError"):
        weft_cli("signal", "nope", "go")
    assert BufferedSignal.objects.count() == 2


def test_query_and_update_call_the_client(runs, monkeypatch):
    calls = []

    def fake_query(self, name, *arg, timeout="5s"):
        calls.append(("query", self.id, name, arg, timeout))
        return {"stage": "waiting", "at": db_now().date()}

    def fake_update(self, name, payload=None, **options):
        calls.append(("update", self.id, name, payload, options))
        return "ok"

    monkeypatch.setattr(WorkflowHandle, "query", fake_query)
    monkeypatch.setattr(WorkflowHandle, "update", fake_update)
    assert "'stage': 'waiting'" in weft_cli("query", "alpha", "stage")
    assert weft_json("query", "alpha", "echo", "--arg", "[1]", "--timeout", "2s")["stage"] == "waiting"
    assert weft_cli("update", "alpha", "set_note", "--payload", '"hi"', "--idempotency-key", "k").strip() == "'ok'"
    assert calls[0] == ("query", "alpha", "stage", (), timedelta(seconds=5))
    assert calls[1] == ("query", "alpha", "echo", ([1],), timedelta(seconds=2))
    assert calls[2] == ("update", "alpha", "set_note", "hi", {"idempotency_key": "k", "timeout": timedelta(seconds=5)})
    with pytest.raises(CommandError, match="--arg is not valid JSON"):
        weft_cli("query", "alpha", "stage", "--arg", "nope")
    with pytest.raises(CommandError, match="must be a duration"):
        weft_cli("query", "alpha", "stage", "--timeout", "soon")


def test_query_and_update_not_built_yet_say_so(runs, monkeypatch):
    def not_yet(*args, **kwargs):
        raise NotImplementedError("weft.query() lands with the messages issue.")

    monkeypatch.setattr(WorkflowHandle, "query", not_yet)
    monkeypatch.setattr(WorkflowHandle, "update", not_yet)
    for subcommand in ("query", "update"):
        with pytest.raises(CommandError, match=f"{subcommand} is not available in this version of weft_django"):
            weft_cli(subcommand, "alpha", "stage")


@weft.workflow(name="cli_tests.counter")
def counter(ctx):
    state = {"n": 0}
    ctx.expose(count=lambda: state["n"])

    def add(value):
        state["n"] += value
        return state["n"]

    ctx.on_update("add", add, validator=lambda value: None if isinstance(value, int) else "must be an int")
    yield ctx.wait_for_signal("stop")
    return state["n"]


@pytest.fixture
def running_engine(transactional_db):
    from weft_django.engine.engine import Engine

    engine = Engine("cli-engine")
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    yield engine
    engine.request_stop()
    thread.join(timeout=20)


def test_query_and_update_through_a_running_engine(running_engine):
    weft.start("cli_tests.counter", id="counter")
    wait_for(lambda: weft.get_handle("counter").describe()["owner_engine"] == "cli-engine", 20, message="claim")
    assert weft_cli("update", "counter", "add", "--payload", "2", "--timeout", "10s").strip() == "2"
    assert weft_json("update", "counter", "add", "--payload", "3", "--timeout", "10s") == 5
    assert weft_cli("query", "counter", "count", "--timeout", "10s").strip() == "5"
    with pytest.raises(CommandError, match='UpdateValidationError: Update "add" rejected by validator: must be an int'):
        weft_cli("update", "counter", "add", "--payload", '"x"', "--timeout", "10s")
    with pytest.raises(CommandError, match="QueryNotFoundError"):
        weft_cli("query", "counter", "nothing", "--timeout", "10s")


def test_query_errors_become_command_errors(runs):
    """With the real client: an unknown id is refused whatever stage the messages work is at."""
    with pytest.raises(CommandError):
        weft_cli("query", "nope", "stage", "--timeout", "100ms")


def test_cancel_needs_confirmation(runs, monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    with pytest.raises(CommandError, match="pass --yes"):
        weft_cli("cancel", "alpha")
    assert Workflow.objects.get(pk="alpha").status == "running"
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    with pytest.raises(CommandError, match="Aborted: nothing was changed"):
        weft_cli("cancel", "alpha")
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert weft_cli("cancel", "alpha").strip() == 'Workflow "alpha" cancelled.'
    assert Workflow.objects.get(pk="alpha").status == "cancelled"
    assert weft_json("cancel", "beta", "--yes", "--reason", "by hand")["status"] == "cancelled"
    assert Workflow.objects.get(pk="beta").cancel_reason == "by hand"
    with pytest.raises(CommandError, match="already ended"):
        weft_cli("cancel", "gamma", "--yes")
    with pytest.raises(CommandError, match="WorkflowNotFoundError"):
        weft_cli("cancel", "nope", "--yes")


def test_suspend_resume_retry(runs):
    assert weft_cli("suspend", "alpha").strip() == 'Workflow "alpha" suspended.'
    with pytest.raises(CommandError, match="WorkflowStateError: Cannot suspend"):
        weft_cli("suspend", "alpha")
    assert weft_json("resume", "alpha")["status"] == "running"
    with pytest.raises(CommandError, match=r"WorkflowStateError: Cannot retry .*\(it has not failed\)"):
        weft_cli("retry", "alpha")
    Workflow.objects.filter(pk="beta").update(
        status="failed", error={"type": "E", "message": "m"}, finished_at=db_now()
    )
    assert weft_cli("retry", "beta").strip() == 'Workflow "beta" retried.'
    assert Workflow.objects.get(pk="beta").status == "running"


def test_purge(runs, monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    now = db_now()
    weft.start("tests.sum", id="old", args=[1, 1])
    Workflow.objects.filter(pk="old").update(status="completed", finished_at=now - timedelta(days=8))
    weft.start("tests.sum", id="older-failure", args=[1, 1])
    Workflow.objects.filter(pk="older-failure").update(status="failed", finished_at=now - timedelta(days=8))
    # Default: what RETENTION says is due (completed after 7 days; failed after 30).
    assert weft_cli("purge", "--dry-run").strip() == (
        "1 workflow(s) due under WEFT['RETENTION'] (completed: 1); none purged."
    )
    with pytest.raises(CommandError, match=r"Purge 1 terminal workflow\(s\) .* pass --yes"):
        weft_cli("purge")
    assert Workflow.objects.filter(pk="old").exists()
    assert weft_json("purge", "--yes") == {"purged": 1, "by_status": {"completed": 1}}
    assert not Workflow.objects.filter(pk="old").exists()
    # --older-than replaces RETENTION; --status narrows it; active runs are never selected.
    assert weft_json("purge", "--older-than", "1d", "--status", "completed", "--dry-run")["would_purge"] == 0
    assert weft_cli("purge", "--older-than", "1d", "--yes").strip() == "Purged 1 workflow(s)."
    assert set(Workflow.objects.values_list("pk", flat=True)) == {"alpha", "beta", "gamma"}
    assert weft_cli("purge", "--older-than", "0s", "--status", "completed", "--yes").strip() == "Purged 1 workflow(s)."
    assert weft_cli("purge", "--older-than", "0s", "--yes").strip().startswith("0 workflow(s)")
    with pytest.raises(CommandError, match="invalid choice: 'running'"):
        weft_cli("purge", "--status", "running")
    with pytest.raises(CommandError, match="must be a duration"):
        weft_cli("purge", "--older-than", "a while")


# ----------------------------------------------------------------------------------------- doctor


@pytest.fixture(autouse=True)
def _quiet_sqlite_warning(settings):
    """weft.W003 (SQLite has one writer) is a true warning on the SQLite run; doctor honours
    SILENCED_SYSTEM_CHECKS like ``manage.py check`` does."""
    settings.SILENCED_SYSTEM_CHECKS = ["weft.W003"]


def doctor(*args: str) -> tuple[dict, bool]:
    """(report, healthy) from doctor --json; unhealthy raises CommandError after printing."""
    out = StringIO()
    try:
        call_command("weft", "doctor", "--json", *args, stdout=out)
    except CommandError as exc:
        assert exc.returncode == 1
        return json.loads(out.getvalue()), False
    return json.loads(out.getvalue()), True


def levels(report: dict) -> dict[str, str]:
    return {check["check"]: check["level"] for check in report["checks"]}


def test_doctor_healthy(db):
    report, ok = doctor()
    assert ok and report["healthy"]
    assert levels(report) == {
        "database": "ok",
        "migrations": "ok",
        "settings": "ok",
        "clock": "ok",
        "engines": "ok",
        "lapsed claims": "ok",
        "overdue timers": "ok",
        "dead engines": "ok",
        "stuck workflows": "ok",
        "unclaimed runs": "ok",
        "queues": "ok",
    }
    text = weft_cli("doctor")
    assert "healthy: 0 error(s), 0 warning(s)." in text and text.splitlines()[0].startswith("OK")


def test_doctor_finds_lapsed_claims_overdue_timers_and_no_live_engine(db):
    weft.start("admin_tests.waits", id="held")
    hold("held", engine_id="engine-doc", expires_in=-120)  # expired long past the takeover grace
    Engine.objects.filter(id="engine-doc").update(heartbeat_at=db_clock() - timedelta(minutes=5))
    run_id = Workflow.objects.get(pk="held").run_id
    Timer.objects.create(
        workflow_id="held", run_id=run_id, kind=TimerKind.SLEEP, seq=0, fire_at=db_now() - timedelta(minutes=3)
    )
    report, ok = doctor()
    assert not ok and not report["healthy"]
    found = levels(report)
    assert found["lapsed claims"] == found["overdue timers"] == found["engines"] == "error"
    assert found["dead engines"] == "error"  # it still holds a claim
    lapsed = next(c for c in report["checks"] if c["check"] == "lapsed claims")
    assert lapsed["details"][0].startswith("held held by engine-doc")
    out = StringIO()
    with pytest.raises(CommandError, match=r"unhealthy \(4 error\(s\), 0 warning\(s\)\)"):
        call_command("weft", "doctor", stdout=out)
    assert "ERROR    lapsed claims" in out.getvalue() and "hint: Start an engine" in out.getvalue()


def test_doctor_warnings_fail_only_when_strict(db):
    weft.start("admin_tests.waits", id="stuck")
    Workflow.objects.filter(pk="stuck").update(
        stuck_error={"type": "NonDeterminismError", "message": "history has a different activity\nmore"}
    )
    ownership_engine = Engine.objects.create(
        id="engine-old", host="h", pid=1, mode="workflow-lease", started_at=db_clock(), heartbeat_at=db_clock()
    )
    Engine.objects.filter(pk=ownership_engine.pk).update(heartbeat_at=db_clock() - timedelta(hours=2))
    Engine.objects.create(
        id="engine-live", host="h", pid=2, mode="workflow-lease", started_at=db_clock(), heartbeat_at=db_clock()
    )
    report, ok = doctor()
    assert ok, report
    found = levels(report)
    assert found["stuck workflows"] == found["dead engines"] == "warning"
    stuck = next(c for c in report["checks"] if c["check"] == "stuck workflows")
    assert stuck["details"] == ["stuck (admin_tests.waits): NonDeterminismError: history has a different activity"]
    _, ok = doctor("--strict")
    assert not ok


def test_doctor_reports_bad_settings(db):
    with override_settings(WEFT={"OWNERSHIP": "bogus"}):
        report, ok = doctor()
    assert not ok
    found = levels(report)
    assert found["settings"] == "error" and found["ownership"] == "skipped"
    settings_check = next(c for c in report["checks"] if c["check"] == "settings")
    assert settings_check["details"][0].startswith("weft.E001: Unknown ownership posture")


# ----------------------------------------------------------------------------------------- subprocess


def run_weft(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m django weft ...`` against this test's database (its name passed via the environment)."""
    name = str(connection.settings_dict["NAME"])
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    env["WEFT_SQLITE_PATH" if connection.vendor == "sqlite" else "WEFT_PG_NAME"] = name
    return subprocess.run(
        [sys.executable, "-m", "django", "weft", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_doctor_exit_codes_as_a_subprocess():
    healthy = run_weft("doctor")
    assert healthy.returncode == 0, healthy.stderr
    assert "healthy: 0 error(s)" in healthy.stdout
    weft.start("admin_tests.waits", id="abandoned")
    hold("abandoned", engine_id="engine-gone", expires_in=-600)
    sick = run_weft("doctor")
    assert sick.returncode == 1
    assert "ERROR    lapsed claims" in sick.stdout and "weft doctor: unhealthy" in sick.stderr
    listed = run_weft("list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["owner_engine"] == "engine-gone"
    refused = run_weft("cancel", "abandoned")  # stdin is not a terminal and there is no --yes
    assert refused.returncode == 1 and "pass --yes" in refused.stderr
    assert Workflow.objects.get(pk="abandoned").status == "running"


def test_doctor_a_dead_engine_within_its_takeover_grace_is_a_warning_then_an_error(db):
    """A killed engine's claims are taken over once its silence passes the TTL and the takeover grace:
    within that window doctor warns (as its "lapsed claims" check waits for the grace), so a liveness
    probe of every healthy pod does not fail while the system heals itself; past it, an error."""
    from weft_django.conf import get_settings
    from weft_django.store.claims import takeover_grace

    settings = get_settings()
    ttl, grace = settings.workflow_claim_ttl, takeover_grace(settings.workflow_claim_renew_interval)
    weft.start("admin_tests.waits", id="dying")
    hold("dying", engine_id="engine-killed", expires_in=3600)
    Engine.objects.create(
        id="engine-live", host="h", pid=2, mode="workflow-lease", started_at=db_clock(), heartbeat_at=db_clock()
    )
    Engine.objects.filter(id="engine-killed").update(heartbeat_at=db_clock() - ttl - timedelta(seconds=1))
    report, ok = doctor()
    assert ok, report
    assert levels(report)["dead engines"] == "warning"
    dead = next(c for c in report["checks"] if c["check"] == "dead engines")
    assert "taken over" in dead["summary"], dead
    Engine.objects.filter(id="engine-killed").update(heartbeat_at=db_clock() - ttl - grace - timedelta(seconds=5))
    report, ok = doctor()
    assert not ok
    assert levels(report)["dead engines"] == "error"
