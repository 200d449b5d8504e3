"""a user's open transaction holding one row lock (SELECT ... FOR UPDATE) must
not stall other workflows' commits (PostgreSQL). Each case parks a workflow ("held"), locks one of its
rows in another connection, runs an engine that must write that row, and starts a good workflow:
the good one must finish while the lock is still held."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection

import weft_django as weft
from tests.engine.test_commit_locks import holding
from weft_django.models import BufferedSignal, Step, Timer
from weft_django.testing import run_until_idle, running_engine, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@weft.workflow(name="tests.locked_rows.waits")
def waits(ctx):
    value = yield ctx.wait_for_signal("go")
    return value


def _finishes_within(handle, limit: float) -> float:
    began = time.monotonic()
    try:
        handle.result(timeout=limit)
    except Exception:
        return float("inf")
    return time.monotonic() - began


def _workflow_row():
    weft.start("tests.locked_rows.waits", id="held")
    run_until_idle(timeout=20)
    weft.signal("held", "go", 1)  # its terminal commit updates its workflow row
    return "SELECT 1 FROM weft_django_workflow WHERE id = %s FOR UPDATE", ["held"], 1.0


def _signal_row():
    weft.start("tests.locked_rows.waits", id="held")
    run_until_idle(timeout=20)
    weft.signal("held", "go", 1)  # its consumption updates the signal row
    pk = BufferedSignal.objects.get(workflow_id="held").pk
    return "SELECT 1 FROM weft_django_bufferedsignal WHERE id = %s FOR UPDATE", [pk], 1.0


def _timer_row():
    weft.start("tests.sleeper", args=[1.5], id="held")
    run_until_idle(timeout=20)
    pk = Timer.objects.get(workflow_id="held").pk  # deleted by the commit that settles the sleep
    return "SELECT 1 FROM weft_django_timer WHERE id = %s FOR UPDATE", [pk], 2.5


CASES = {"workflow": _workflow_row, "signal": _signal_row, "timer": _timer_row}


@pytest.mark.parametrize("row", list(CASES))
def test_a_row_locked_by_a_user_does_not_stall_other_workflows(row):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    sql, params, settle = CASES[row]()
    with holding(sql, params, hold_at_most=40), running_engine("lock-engine"):
        time.sleep(settle)  # the engine is now writing the locked row
        good = weft.start("tests.sum", args=[2, 3], id="good")
        took = _finishes_within(good, 20)
        assert took < 5, f"a good workflow took {took:.1f}s while one {row} row was locked"


def test_a_step_row_locked_by_a_user_does_not_stall_other_workflows():
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    weft.start("tests.child", args=["held-step", 1.5], id="held")
    with running_engine("lock-engine"):
        wait_for(lambda: Step.objects.filter(workflow_id="held", status="running").exists(), 20)
        with holding("SELECT 1 FROM weft_django_step WHERE workflow_id = %s FOR UPDATE", ["held"], hold_at_most=40):
            time.sleep(2.0)  # the activity has ended: its commit updates the locked step row
            good = weft.start("tests.sum", args=[2, 3], id="good")
            took = _finishes_within(good, 20)
        weft.get_handle("held").result(timeout=30)
    from tests.testapp.models import ActivityCall

    runs = ActivityCall.objects.filter(name="slow_step", key="held-step").count()
    assert (took < 5, runs) == (True, 1), f"good took {took:.1f}s; the held step's activity ran {runs} times"


def test_a_pending_workflow_row_locked_by_a_user_does_not_stall_other_workflows():
    """A delayed start comes due while a user's transaction holds the pending run's workflow row:
    start_delayed locks the workflow rows without SKIP LOCKED (store/claims/admission.py), waits
    out lock_timeout, and the tick's DatabaseError reloads every workflow the engine holds."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    weft.start("tests.sum", args=[1, 2], id="held", start_after=timedelta(seconds=1))
    locked = holding("SELECT 1 FROM weft_django_workflow WHERE id = %s FOR UPDATE", ["held"], hold_at_most=40)
    with running_engine("lock-engine"):
        with locked:
            time.sleep(2.0)  # the delayed start is due: the engine tries to start it
            good = weft.start("tests.sum", args=[2, 3], id="good")
            took = _finishes_within(good, 20)
            assert took < 5, f"a good workflow took {took:.1f}s while a pending run's row was locked"
        assert weft.get_handle("held").result(timeout=20) == {"total": 3}  # started once the lock went


def test_the_engine_row_locked_by_a_user_does_not_stall_renewal():
    """Renewal heartbeats the engine row after each pass (engine/renewal.py:217) with a plain UPDATE:
    a user's lock on that row holds the renewal thread for lock_timeout (half the claim TTL) per pass."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    from weft_django.models import WorkflowClaim

    weft.start("tests.locked_rows.waits", id="parked")
    with running_engine("lock-engine"):
        wait_for(lambda: WorkflowClaim.objects.filter(pk="parked", engine_id="lock-engine").exists(), 20)
        with holding("SELECT 1 FROM weft_django_engine WHERE id = %s FOR UPDATE", ["lock-engine"], hold_at_most=40):
            seen = set()
            began = time.monotonic()
            while time.monotonic() - began < 14:
                seen.add(WorkflowClaim.objects.get(pk="parked").expires_at)
                time.sleep(0.2)
            # renewed every WORKFLOW_CLAIM_RENEW_INTERVAL (5 s): at least twice in 14 s
            assert len(seen) >= 3, (
                f"the claim was renewed {len(seen) - 1} time(s) in 14 s while the engine row was locked"
            )


@pytest.mark.django_db(transaction=False)
def test_the_commits_lock_wait_stays_inside_the_commit():
    """An engine driven inside the caller's transaction (a test's atomic block): the commit's SET LOCAL
    lock_timeout outlived its savepoint and stayed for the rest of the caller's transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        before = cursor.fetchone()[0]
    weft.start("tests.sleeper", args=[0.01], id="s")  # a timer: the general path
    run_until_idle(timeout=20)
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == before


@pytest.mark.parametrize("name,args", [("tests.sum", [1, 2]), ("tests.sleeper", [0.01])])
def test_commits_work_with_server_side_binding(name, args):
    """With OPTIONS["server_side_binding"] (docs/settings.md supports it) a query string takes one
    statement: the commit's SET LOCAL sent with its lock made every commit fail (and the one-statement
    commit, with its planner settings, already did)."""
    from django.db import connections

    from weft_django.models import Workflow

    connections["default"].close()
    connections["default"].settings_dict.setdefault("OPTIONS", {})["server_side_binding"] = True
    try:
        weft.start(name, args=args, id="ssb")
        run_until_idle(timeout=15)
        assert Workflow.objects.get(pk="ssb").status == "completed"
    finally:
        connections["default"].settings_dict["OPTIONS"].pop("server_side_binding", None)
        connections["default"].close()


@pytest.mark.django_db(transaction=False)
def test_held_back_workflows_are_tried_alone_one_per_commit_with_back_off(monkeypatch):
    """A lock on a whole table (a migration) blocks every workflow: each commit then tries one of them
    alone (100 ms at most), not one per held-back workflow."""
    from weft_django.engine.containment import LockedRows
    from weft_django.store.commit import WorkflowWrites

    clock = [100.0]
    monkeypatch.setattr("weft_django.engine.containment.time.monotonic", lambda: clock[0])
    rows = LockedRows()
    batch = [WorkflowWrites(wid, "run", 1) for wid in ("a", "b", "c", "d")]
    for wid in ("a", "b", "c"):
        rows.blocked(wid)
    together, alone, deferred = rows.sort(batch)
    assert ([w.workflow_id for w in together], alone, deferred) == (["d"], [], {"a", "b", "c"})
    clock[0] += 0.2  # past the first back-off (0.1 s)
    together, alone, deferred = rows.sort(batch)
    assert ([w.workflow_id for w in together], [w.workflow_id for w in alone]) == (["d"], ["a"])
    assert deferred == {"b", "c"}
    rows.blocked("a")  # it waited again: 0.2 s now
    clock[0] += 0.15
    assert rows.sort(batch[:1]) == ([], [], {"a"})
    rows.forget(["a", "b", "c"])
    assert rows.sort(batch) == (batch, [], set())


def test_a_workflow_dropped_by_the_engine_is_not_held_back_when_it_comes_back():
    """A held-back workflow the engine stops driving (deposed, reloaded) and takes again must not
    wait out the old back-off (up to 2 s) before its first commit: the entry goes with the context."""
    from weft_django.engine.engine import Engine

    weft.start("tests.locked_rows.waits", id="dropped")
    engine = Engine("locked-drop", concurrency=2)
    engine.start()
    wait_for(lambda: engine.tick() is not None and "dropped" in engine.owned, timeout=20)
    for _ in range(6):  # blocked six times: its back-off is at its longest, 2 s
        engine.locked_rows.blocked("dropped")
    engine.reload_batch(["dropped"])  # as after a failed commit: dropped, loaded again by the next pass
    try:
        assert engine.locked_rows.sort([]) == ([], [], set())
        from weft_django.store.commit import WorkflowWrites

        together, alone, deferred = engine.locked_rows.sort([WorkflowWrites("dropped", "run", 1)])
        assert deferred == set() and alone == [] and [w.workflow_id for w in together] == ["dropped"]
    finally:
        engine.shutdown()
