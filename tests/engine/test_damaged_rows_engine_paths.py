"""Damaged rows the engine reads outside a workflow's load (docs/concepts.md: a row that cannot be
decoded stops that run, never the engine). tests/engine/test_damaged_rows_sweep.py and test_bad_rows.py
cover the load (runs, steps, timers, signals, inputs); these are the other readers a probe of every
(table, column, damage) found failing:

- the admitted updates the mailbox look reads every pass (their ``created_at`` was read into Python to
  sort them, so one past year 9999 failed every pass of the engine);
- a failed step's recorded error naming no exception weft records (it was thrown into the workflow as
  a WaitTimeoutError and failed the run for a reason it never had);
- the ownership-mode marker's ``set_at`` (read at every engine's start: no engine could start);
- the store lease (``OWNERSHIP="lease"``) held by a dead engine with an expiry no renewal sets (no
  engine could take it, ever);
- on SQLite, the store lease whose expiry, or whose holder's heartbeat, is text that is no date (the
  acquire's read raised ValueError: no engine could take the lease);
- on SQLite, a timer whose ``fire_at`` is text that is no date (the ORM reads it as None: it poisoned
  the engine's timer heap, failing every pass) and an admitted update whose id is no uuid (its read
  raised in a loop over other workflows, which got stuck in its place).

Each writes the row by hand in SQL, runs a real engine pass beside a healthy workflow, and checks that
the healthy one completes, the damaged one is marked with its reason, and the engine did not fail its
passes.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

import weft_django as weft
from tests.testapp.workflows import add
from weft_django.models import PendingUpdate, Workflow
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

TOO_LATE = "'infinity'"
TOO_EARLY = "timestamptz '0001-01-01 00:00:00+00' - interval '1 day'"


@weft.workflow(name="tests.damaged_engine_paths.counter")
def counter(ctx: Any) -> Any:
    state = {"n": 0}

    def bump(amount: int) -> int:
        state["n"] += amount
        return state["n"]

    ctx.on_update("bump", bump)
    yield ctx.wait_for_signal("go")
    return state["n"]


@weft.workflow(name="tests.damaged_engine_paths.activity_then_signal")
def activity_then_signal(ctx: Any) -> Any:
    total = yield ctx.run(add, 1, 2)
    extra = yield ctx.wait_for_signal("go")
    return [total, extra]


def _sql(statement: str, params: Any = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _good_one_completes(caplog: pytest.LogCaptureFixture, **engine: Any) -> None:
    """Start a healthy workflow and run an engine until idle beside the damaged row: the healthy one
    completes and no pass of the engine failed."""
    good = weft.start("tests.sum", args=[2, 3], id="good")
    run_until_idle(timeout=15, **engine)  # before: TimeoutError (every pass failed), or the engine did not start
    assert good.result(timeout=5) == {"total": 5}
    assert "database error in tick" not in caplog.text and "engine pass failed" not in caplog.text, caplog.text


def _stuck(workflow_id: str) -> dict[str, Any]:
    status, stuck = Workflow.objects.values_list("status", "stuck_error").get(pk=workflow_id)
    assert status == "running" and stuck is not None, (status, stuck)
    return dict(stuck)


@pytest.fixture
def errors(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.ERROR, logger="weft_django")
    return caplog


# -- an admitted update's created_at past year 9999 --------------------------------------------------
@pytest.mark.postgres
@pytest.mark.parametrize("moment", [TOO_LATE, TOO_EARLY], ids=["past year 9999", "before year 1"])
def test_an_admitted_updates_unreadable_created_at_stops_no_pass(errors, moment):
    """The mailbox look read each admitted update's created_at to sort them across chunks: psycopg's
    DataError failed the pass (every pass), so no workflow of the engine moved again."""
    damaged = weft.start("tests.damaged_engine_paths.counter", id="damaged")
    run_until_idle(timeout=15)  # parked at its signal wait, its update handler registered
    _sql(
        f"INSERT INTO {PendingUpdate._meta.db_table} (id, workflow_id, run_id, name, payload, status, created_at) "
        "SELECT '11111111-1111-1111-1111-111111111111', id, run_id, 'bump', '2', 'admitted', now() "
        f"FROM {Workflow._meta.db_table} WHERE id = 'damaged'"
    )
    _sql(f"UPDATE {PendingUpdate._meta.db_table} SET created_at = {moment}")
    _good_one_completes(errors)
    # The update itself is sound: it is applied (its created_at is only its place in the order).
    assert PendingUpdate.objects.values_list("status", flat=True).get() == "completed"
    damaged.signal("go")
    run_until_idle(timeout=15)
    assert damaged.result(timeout=5) == 2


# -- a failed step's error naming no exception weft records -------------------------------------------
@pytest.mark.parametrize(
    "error",
    ['{"type": "ValueError", "message": "no"}', '{"exc": "NoSuchError", "type": "X", "message": "m"}'],
    ids=["no exc", "an unknown exc"],
)
def test_a_recorded_error_of_no_known_exception_makes_the_run_stuck_not_failed(errors, error):
    """error_to_exception threw a WaitTimeoutError ("The wait timed out.") for any recorded error
    without a known "exc": the run failed for good, for a reason it never had."""
    damaged = weft.start("tests.damaged_engine_paths.activity_then_signal", id="damaged")
    run_until_idle(timeout=15)  # step 0 (the activity) recorded, parked at the signal wait
    _sql("UPDATE weft_django_step SET status = 'failed', error = %s WHERE workflow_id = 'damaged'", [error])
    damaged.signal("go", 1)  # runnable again: step 0 is replayed
    good = weft.start("tests.sum", args=[2, 3], id="good")
    run_until_idle(timeout=15)
    assert good.result(timeout=5) == {"total": 5}
    stuck = _stuck("damaged")  # before: status "failed", error WaitTimeoutError
    assert stuck["type"] == "CorruptPayloadError", stuck
    assert "the error of step 0" in stuck["message"] and "names no exception weft records" in stuck["message"]


# -- the ownership-mode marker ------------------------------------------------------------------------
@pytest.mark.postgres
def test_an_engine_starts_over_an_ownership_marker_whose_set_at_python_cannot_hold(errors):
    """Every engine reads the marker at start: its set_at past year 9999 raised DataError there, so no
    engine could start (set_at only dates the marker in the mismatch message)."""
    run_until_idle(timeout=15)  # writes the marker
    _sql(f"UPDATE weft_django_ownershipmarker SET set_at = {TOO_LATE}")
    _good_one_completes(errors)  # before: DataError from run_until_idle's start


@pytest.mark.postgres
def test_a_mode_mismatch_over_such_a_marker_still_says_which_mode(errors):
    from weft_django.engine.ownership import check_mode_marker
    from weft_django.exceptions import OwnershipModeMismatchError

    check_mode_marker("first", "workflow-lease", "default")
    _sql(f"UPDATE weft_django_ownershipmarker SET set_at = {TOO_LATE}")
    with pytest.raises(OwnershipModeMismatchError, match="OWNERSHIP='workflow-lease' .set by engine 'first' at a time"):
        check_mode_marker("second", "none", "default")


# -- the store lease ----------------------------------------------------------------------------------
LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s", "LEASE_WAIT_TIMEOUT": "6s"}


@pytest.mark.parametrize("ahead", ["far", "an hour"])
def test_a_lease_a_dead_engine_holds_with_an_expiry_no_renewal_sets_is_taken(errors, ahead):
    """OWNERSHIP="lease": the lease row's expiry edited far ahead (or 'infinity') with its holder dead.
    A renewal never sets it more than LEASE_TTL ahead; claims in that state are taken once their
    holder's heartbeat is old (store/claims/lapse.py), the lease was never: every engine timed out
    waiting for it (EngineLeaseAcquisitionTimeoutError), for ever."""
    with override_settings(WEFT=LEASE):
        run_until_idle(timeout=15)  # the mode marker and the lease row
        postgres = connection.vendor == "postgresql"
        old = "now() - interval '1 hour'" if postgres else "datetime('now', '-1 hour')"
        expiry = {
            ("far", True): TOO_LATE,
            ("an hour", True): "now() + interval '1 hour'",
            ("far", False): "'9999-12-31 00:00:00'",
            ("an hour", False): "datetime('now', '+1 hour')",
        }[(ahead, postgres)]
        _sql(
            "INSERT INTO weft_django_engine (id, host, pid, mode, started_at, heartbeat_at, stopped_at) "
            f"VALUES ('dead-engine', 'elsewhere', 1, 'lease', {old}, {old}, NULL)"
        )
        _sql(f"UPDATE weft_django_storelease SET engine_id = 'dead-engine', expires_at = {expiry}")
        _good_one_completes(errors)  # before: EngineLeaseAcquisitionTimeoutError


def test_a_lease_a_live_engine_holds_is_not_taken(errors):
    """The same expiry with a heartbeat that is not old: its holder may be alive (a longer LEASE_TTL
    of another deploy), so the lease is left to it."""
    from weft_django.store.clock import db_clock
    from weft_django.store.engines import acquire_store_lease

    _sql("INSERT INTO weft_django_storelease (id, epoch) VALUES (1, 0)")
    now = db_clock()
    _sql(
        "INSERT INTO weft_django_engine (id, host, pid, mode, started_at, heartbeat_at, stopped_at) "
        "VALUES ('live-engine', 'elsewhere', 1, 'lease', %s, %s, NULL)",
        [now, now],
    )
    from datetime import timedelta

    _sql("UPDATE weft_django_storelease SET engine_id = 'live-engine', expires_at = %s", [now + timedelta(hours=1)])
    assert acquire_store_lease("me", ttl=timedelta(seconds=3), grace=timedelta(seconds=2), using="default") is None


NO_DATE = ["0000-01-01 00:00:00", "2024-13-01 00:00:00", "2024-02-30 10:00:00", "garbage"]


@pytest.mark.sqlite
@pytest.mark.parametrize("column", ["expires_at", "heartbeat_at"])
@pytest.mark.parametrize("text", NO_DATE)
def test_a_lease_whose_expiry_or_holders_heartbeat_is_no_date_keeps_no_engine_from_starting(errors, column, text):
    """SQLite, OWNERSHIP="lease": the lease's expiry, or its (dead) holder's heartbeat, is text that is
    no real date. The acquire read both through the driver's conversion of the datetime column, which
    raised ValueError ("month must be in 1..12"): no engine could take the lease, or start, while the
    row stayed so. They are read as text now: one that is no date is no time (the lease is taken when
    its expiry is none, kept by an expiry when its holder's heartbeat is none)."""
    with override_settings(WEFT=LEASE):
        run_until_idle(timeout=15)  # the mode marker and the lease row
        old = "datetime('now', '-1 hour')"
        _sql(
            "INSERT INTO weft_django_engine (id, host, pid, mode, started_at, heartbeat_at, stopped_at) "
            f"VALUES ('dead-engine', 'elsewhere', 1, 'lease', {old}, {old}, NULL)"
        )
        _sql(f"UPDATE weft_django_storelease SET engine_id = 'dead-engine', expires_at = {old}")
        _sql(f"UPDATE weft_django_{'storelease' if column == 'expires_at' else 'engine'} SET {column} = %s", [text])
        _good_one_completes(errors)  # before: ValueError from acquire_store_lease


@pytest.mark.parametrize("at", ["far ahead", "far behind"])
def test_another_engines_heartbeat_python_cannot_hold_stops_no_engine(errors, at):
    """Another engine's row whose heartbeat Python cannot hold (PostgreSQL: 'infinity', '-infinity';
    SQLite: text that is no date), holding a claim that expired: the engines compare heartbeats in SQL
    and never read one, so the claim is taken over and both runs complete (a guard: this held before)."""
    postgres = connection.vendor == "postgresql"
    heartbeat = {
        True: "infinity" if at == "far ahead" else "-infinity",
        False: "soon" if at == "far ahead" else "0000-01-01 00:00:00",
    }[postgres]
    past = "now() - interval '1 minute'" if postgres else "datetime('now', '-1 minute')"
    _sql(
        "INSERT INTO weft_django_engine (id, host, pid, mode, started_at, heartbeat_at, stopped_at) "
        f"VALUES ('other-engine', 'elsewhere', 1, 'workflow-lease', {past}, %s, NULL)",
        [heartbeat],
    )
    held = weft.start("tests.sum", args=[1, 2], id="held")
    _sql(
        f"UPDATE weft_django_workflowclaim SET engine_id = 'other-engine', expires_at = {past} "
        "WHERE workflow_id = 'held'"
    )
    _good_one_completes(errors)
    assert held.result(timeout=5) == {"total": 3}


# -- SQLite: text that is no date in a timer, text that is no uuid in an update's id ------------------
@pytest.mark.sqlite
@pytest.mark.parametrize("text", ["garbage", "10000-01-01 00:00:00"])
def test_a_timer_whose_fire_at_is_no_date_makes_only_its_run_stuck(errors, text):
    """SQLite keeps any text in a datetime column; the ORM reads one that is no date as None. The
    loaded timer went into the engine's timer heap, whose next comparison raised in every pass: no
    workflow of the engine moved again (before: TimeoutError, "engine pass failed" every pass)."""
    weft.start("tests.sleeper", args=[3600], id="damaged")
    run_until_idle(timeout=15)  # parked: its sleep timer armed
    _sql("UPDATE weft_django_timer SET fire_at = %s WHERE workflow_id = 'damaged'", [text])
    good = weft.start("tests.sum", args=[2, 3], id="good")
    run_until_idle(timeout=15)
    assert good.result(timeout=5) == {"total": 5}
    stuck = _stuck("damaged")
    assert stuck["type"] == "EngineInternalError"
    assert "a timer's fire_at holds a value that is not a time" in stuck["message"]


@pytest.mark.sqlite
def test_an_admitted_update_whose_id_is_no_uuid_makes_its_own_run_stuck_not_another(errors):
    """The mailbox look's read raised for that row inside a loop over the workflows it looked at; the
    engine made stuck whichever workflow that loop's variable named last (engine/containment.culprit),
    a healthy one as often as not."""
    healthy = [f"healthy-{i}" for i in range(8)]
    for wid in ["damaged", *healthy]:
        weft.start("tests.damaged_engine_paths.counter", id=wid)
    run_until_idle(timeout=15)  # all parked at their signal wait
    _sql(
        f"INSERT INTO {PendingUpdate._meta.db_table} (id, workflow_id, run_id, name, payload, status, created_at) "
        f"SELECT 'not-a-uuid', id, run_id, 'bump', '2', 'admitted', datetime('now') "
        f"FROM {Workflow._meta.db_table} WHERE id = 'damaged'"
    )
    for wid in healthy:
        weft.get_handle(wid).signal("go")
    good = weft.start("tests.sum", args=[2, 3], id="good")
    run_until_idle(timeout=20)
    assert good.result(timeout=5) == {"total": 5}
    made_stuck = {
        record.getMessage().split("workflow=", 1)[1].split(" ", 1)[0]
        for record in errors.records
        if record.getMessage().startswith("workflow stuck workflow=")
    }
    assert made_stuck == {"damaged"}, made_stuck  # before: healthy ones too (retried later, so they end)
    stuck = dict(Workflow.objects.filter(stuck_error__isnull=False).values_list("id", "stuck_error"))
    assert list(stuck) == ["damaged"], stuck
    assert "its id holds 'not-a-uuid', not a uuid" in stuck["damaged"]["message"]
    assert set(Workflow.objects.filter(pk__in=healthy).values_list("status", flat=True)) == {"completed"}
