"""One bad row or one absurd duration stops one workflow, never the engine (issue 21, item 8).

Each case corrupts a row in the database directly (or runs workflow code with an absurd duration),
starts a good workflow that the same engine claims in the same batch, and runs an engine. The engine
must not raise; the bad workflow ends failed (an input that cannot be decoded, a duration over the
bound) or stuck (a recorded step result, step error or signal payload that cannot be decoded, a bug
in the engine's handling of it) with the reason; the good one completes.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

import weft_django as weft
from tests.testapp.workflows import add, flaky, refuses
from weft_django.models import BufferedSignal, Engine, Step, Workflow
from weft_django.testing import running_engine, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


# -- workflows of this file ----------------------------------------------------------------------
@weft.workflow(name="tests.bad_rows.activity_then_signal")
def activity_then_signal(ctx):
    total = yield ctx.run(add, 1, 2)
    extra = yield ctx.wait_for_signal("go")
    return [total, extra]


@weft.workflow(name="tests.bad_rows.failure_then_signal")
def failure_then_signal(ctx):
    try:
        yield ctx.run(refuses, "bad-rows")
    except weft.ActivityError as error:
        attempts = error.attempts
    yield ctx.wait_for_signal("go")
    return attempts


@weft.workflow(name="tests.bad_rows.absurd")
def absurd(ctx, case: str, key: str):
    huge = timedelta(days=999_999_999)
    if case == "sleep":
        yield ctx.sleep(huge)
    elif case == "signal timeout":
        yield ctx.wait_for_signal("go", timeout=huge)
    elif case == "backoff_multiplier huge":
        yield ctx.run(_flaky(backoff_multiplier=1e308), key, 5)
    elif case == "backoff_multiplier inf":
        yield ctx.run(_flaky(backoff_multiplier=float("inf")), key, 5)
    elif case == "backoff_multiplier nan":
        yield ctx.run(_flaky(backoff_multiplier=float("nan")), key, 5)
    elif case == "initial_backoff huge":
        yield ctx.run(_flaky(initial_backoff="99999999d", max_backoff="99999999d"), key, 5)
    return "unreachable"


def _flaky(**retry: Any) -> Any:
    """flaky with a retry policy built in workflow code (where a refused policy raises into the run)."""
    return flaky.options(retry=weft.RetryPolicy(**{"max_attempts": 3, "initial_backoff": "10ms", **retry}))


# -- helpers --------------------------------------------------------------------------------------
def _run_with_a_good_one(weft_run_until_idle: Any) -> None:
    """Start a good workflow, run an engine in process until idle: it must not raise, and the good
    workflow (claimed in the same batch as the bad one) completes."""
    good = weft.start("tests.sum", args=[2, 3], id="good")
    weft_run_until_idle()
    assert good.result(timeout=5) == {"total": 5}


def _stuck_error(workflow_id: str) -> dict[str, Any]:
    row = Workflow.objects.get(pk=workflow_id)
    assert row.status == "running", row.status
    assert row.stuck_error is not None, "expected the workflow to be stuck"
    return row.stuck_error


def _failed_error(workflow_id: str) -> dict[str, Any]:
    row = Workflow.objects.get(pk=workflow_id)
    assert row.status == "failed", (row.status, row.stuck_error)
    return row.error


def _describe(workflow_id: str) -> str:
    out = io.StringIO()
    call_command("weft", "describe", workflow_id, stdout=out)
    return out.getvalue()


# -- a corrupt input: the run fails --------------------------------------------------------------
INPUTS = [
    ("not json", "not json", "not valid JSON"),
    ("unknown tag", '{"$weft": "pickle", "v": "x"}', "malformed tagged value"),
    (
        "zone path",
        '{"args": [{"$weft": "datetime", "v": "2024-01-01T00:00:00[../../etc/passwd]"}], "kwargs": {}}',
        "ZoneInfo",
    ),
    ("deep nesting", "[" * 100_000, "nested too deeply"),
    ("NaN", "NaN", "NaN"),
    ("not an object", "[1, 2]", "not {'args'"),
    ("args not a list", '{"args": 5, "kwargs": {}}', "'args' is a int"),
]


@pytest.mark.parametrize(("case", "text", "fragment"), INPUTS, ids=[c[0] for c in INPUTS])
def test_a_corrupt_input_fails_its_run_only(weft_run_until_idle, case, text, fragment):
    weft.start("tests.sum", args=[1, 2], id="bad")
    Workflow.objects.filter(pk="bad").update(input=text)
    _run_with_a_good_one(weft_run_until_idle)
    error = _failed_error("bad")
    assert error["type"] == "CorruptPayloadError"
    assert "cannot start: its stored input cannot be decoded" in error["message"]
    assert fragment in error["message"]
    with pytest.raises(weft.WorkflowFailedError):
        weft.get_handle("bad").result(timeout=5)


# -- a corrupt recorded history: the run is stuck, naming the step --------------------------------
def _corrupt_result() -> None:
    Step.objects.filter(workflow_id="bad", seq=0).update(result="garbage")


def _corrupt_error(error: Any) -> Any:
    def corrupt() -> None:
        Step.objects.filter(workflow_id="bad", seq=0).update(error=error)

    return corrupt


ACTIVITY_ERROR = {"exc": "ActivityError", "type": "ValueError", "message": "no", "traceback": "", "activity": "x"}
HISTORY = [
    ("completed step result garbage", "tests.bad_rows.activity_then_signal", _corrupt_result, "step 0"),
    ("failed step error a string", "tests.bad_rows.failure_then_signal", _corrupt_error("oops"), "JSON string"),
    ("failed step error a list", "tests.bad_rows.failure_then_signal", _corrupt_error(["a", 1]), "JSON array"),
    (
        "failed step attempts many",
        "tests.bad_rows.failure_then_signal",
        _corrupt_error({**ACTIVITY_ERROR, "attempts": "many"}),
        "'attempts' must be a whole number",
    ),
    (
        "failed step message a number",
        "tests.bad_rows.failure_then_signal",
        _corrupt_error({**ACTIVITY_ERROR, "message": 5}),
        "'message' must be a string",
    ),
]


@pytest.mark.parametrize(("case", "workflow", "corrupt", "fragment"), HISTORY, ids=[c[0] for c in HISTORY])
def test_a_corrupt_step_makes_its_run_stuck_only(weft_run_until_idle, case, workflow, corrupt, fragment):
    bad = weft.start(workflow, id="bad")
    weft_run_until_idle()  # parks at the signal wait, its step 0 recorded
    assert Step.objects.filter(workflow_id="bad", seq=0).exclude(status="running").exists()
    corrupt()
    bad.signal("go", 1)  # runnable again: it replays step 0 next to the good one
    _run_with_a_good_one(weft_run_until_idle)
    error = _stuck_error("bad")
    assert error["type"] == "CorruptPayloadError"
    assert "step 0" in error["message"] and fragment in error["message"], error["message"]
    assert "Repair that row" in error["message"]
    described = _describe("bad")
    assert "stuck on" in described and "CorruptPayloadError" in described


def test_a_corrupt_buffered_signal_makes_its_run_stuck_only(weft_run_until_idle):
    bad = weft.start("tests.signals", id="bad")
    bad.signal("go", {"x": 1})
    BufferedSignal.objects.filter(workflow_id="bad").update(payload="garbage")
    _run_with_a_good_one(weft_run_until_idle)
    error = _stuck_error("bad")
    assert error["type"] == "CorruptPayloadError"
    assert "step 0 (signal 'go')" in error["message"] and "not valid JSON" in error["message"]


def test_a_corrupt_child_terminal_record_makes_the_parent_stuck_only(weft_run_until_idle):
    from weft_django.store.children import mailbox_name

    parent = weft.start("tests.parent_waits_forever", args=["abandon"], id="bad")
    weft_run_until_idle()  # the parent waits for its child, which waits for a signal
    run_id = Workflow.objects.get(pk="bad").run_id
    BufferedSignal.objects.create(
        workflow_id="bad",
        run_id=run_id,
        name=mailbox_name(0),
        signal_id=mailbox_name(0),
        payload="garbage",
        created_at=timezone.now(),
    )
    _run_with_a_good_one(weft_run_until_idle)
    error = _stuck_error(parent.id)
    assert error["type"] == "CorruptPayloadError"
    assert "child-terminal record" in error["message"]


# -- absurd durations in workflow code: the run fails with the bound ----------------------------
ABSURD = [
    ("sleep", "ctx.sleep duration must be at most 100 years"),
    ("signal timeout", "wait_for_signal timeout must be at most 100 years"),
    ("backoff_multiplier huge", "backoff_multiplier must be a number >= 1 and <= 1000"),
    ("backoff_multiplier inf", "backoff_multiplier must be a number >= 1 and <= 1000"),
    ("backoff_multiplier nan", "backoff_multiplier must be a number >= 1 and <= 1000"),
    ("initial_backoff huge", "RetryPolicy.initial_backoff must be at most 100 years"),
]


@pytest.mark.parametrize(("case", "fragment"), ABSURD, ids=[c[0] for c in ABSURD])
def test_an_absurd_duration_fails_its_run_only(weft_run_until_idle, case, fragment):
    weft.start("tests.bad_rows.absurd", args=[case, f"absurd-{case}"], id="bad")
    _run_with_a_good_one(weft_run_until_idle)
    error = _failed_error("bad")
    assert error["type"] == "WorkflowDefinitionError"
    assert fragment in error["message"], error["message"]


def test_the_bound_is_one_value_and_every_form_is_checked_against_it():
    from weft_django.durations import MAX_DURATION, DurationTooLong, to_ms

    assert to_ms(MAX_DURATION) == to_ms("36500d")
    for value in ("36501d", 10**12, 1e308, timedelta.max, timedelta.min, "99999999d"):
        with pytest.raises(DurationTooLong, match="at most 100 years"):
            to_ms(value, "the duration")
    policy = weft.RetryPolicy(max_attempts=10**9, backoff_multiplier=1000, max_backoff="36500d")
    assert policy.backoff(10**9 - 1) == MAX_DURATION  # no OverflowError for any attempt number


# -- a bug in the engine's handling of one workflow: that one is stuck ---------------------------
def test_an_engine_bug_for_one_workflow_makes_it_stuck_not_the_engine(weft_run_until_idle, monkeypatch):
    from weft_django.engine.progress import Progress

    original = Progress._arm_timer

    def broken(self, owned, *args, **kwargs):
        if owned.workflow_id == "bad":
            raise RuntimeError("a bug in the engine, for this workflow only")
        return original(self, owned, *args, **kwargs)

    monkeypatch.setattr(Progress, "_arm_timer", broken)
    weft.start("tests.sleeper", args=[3600], id="bad")
    _run_with_a_good_one(weft_run_until_idle)
    error = _stuck_error("bad")
    assert error["type"] == "EngineInternalError"
    assert "RuntimeError: a bug in the engine, for this workflow only" in error["message"]


@pytest.mark.sqlite
def test_a_row_the_loader_cannot_convert_leaves_the_others_running(caplog):
    """SQLite keeps any text in a uuid column: the batched loader raises for that row, the engine loads
    the batch one by one and serves the rest (the bad one is released and logged every poll)."""
    weft.start("tests.sum", args=[1, 2], id="bad")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Workflow._meta.db_table} SET run_id = 'not-a-uuid' WHERE id = 'bad'")
    good = weft.start("tests.sum", args=[2, 3], id="good")
    with running_engine("loader-engine") as engine:  # re-raises at exit if the engine thread died
        assert good.result(timeout=30) == {"total": 5}
        assert engine.engine_id == "loader-engine"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status FROM {Workflow._meta.db_table} WHERE id = 'bad'")
        assert cursor.fetchone()[0] == "running"
    assert "loading them one by one" in caplog.text and "workflow rows unreadable workflow=bad" in caplog.text


# -- a forged run_maintenance message cannot act as a live engine ---------------------------------
def test_run_maintenance_task_ignores_an_engine_id_from_the_message():
    pytest.importorskip("celery")
    from weft_django.contrib.celery import run_maintenance_task

    handle = weft.start("tests.sum", args=[4, 5], id="maintained")
    with running_engine("live-engine"):
        assert handle.result(timeout=30) == {"total": 9}
        live = Engine.objects.get(pk="live-engine")
        assert live.stopped_at is None
        run_maintenance_task.apply(kwargs={"engine_id": "live-engine"})  # as a broker message would
        live.refresh_from_db()
        assert live.stopped_at is None, "a forged message ended a live engine's registration"
        maintenance = Engine.objects.exclude(pk="live-engine").get()
        assert maintenance.stopped_at is not None  # the pass ran under an id of its own, and stopped


# -- a real weft_engine process -------------------------------------------------------------------
@pytest.mark.subprocess
def test_a_weft_engine_process_keeps_serving_past_corrupt_rows(weft_engines):
    weft.start("tests.sum", args=[1, 2], id="bad-input")
    Workflow.objects.filter(pk="bad-input").update(input="not json")
    bad_signal = weft.start("tests.signals", id="bad-signal")
    bad_signal.signal("go", 1)
    BufferedSignal.objects.filter(workflow_id="bad-signal").update(payload="garbage")
    good = weft.start("tests.sum", args=[2, 3], id="good")
    fast = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}
    engine = weft_engines("survives-bad-rows", env=fast)
    assert good.result(timeout=60) == {"total": 5}
    assert _failed_error("bad-input")["type"] == "CorruptPayloadError"
    wait_for(lambda: Workflow.objects.filter(pk="bad-signal", stuck_error__isnull=False).exists(), 30, message="stuck")
    assert engine.process.poll() is None, engine.output()  # still running
    later = weft.start("tests.sum", args=[3, 4], id="later")
    assert later.result(timeout=60) == {"total": 7}  # and still serving
    assert engine.stop() == 0
