"""Where a stuck loop can be stuck (engine/stall.py): in workflow code during a live turn, in a replay
on load, in an update handler or validator, in a query handler, in a cancel handler. Each time the
engine keeps the claim of the workflow it is stuck in and hands its other workflows (resident or
evicted) over to a peer; a second SIGTERM ends an engine whose loop does not return; "lease" mode
changes nothing.

Every test: the first engine holds a parked workflow (``tests.signals``) and the one that gets stuck;
once its loop is stuck, a second engine starts, the parked one is signalled and must end there, while
the stuck one stays with the first engine.
"""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

import weft_django as weft
from weft_django.models import Step, WorkflowClaim
from weft_django.testing import wait_for
from weft_django.waits import close_connections

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "200ms"}
FOREVER = 600.0


def _holder(workflow_id: str) -> str | None:
    return WorkflowClaim.objects.filter(pk=workflow_id).values_list("engine_id", flat=True).first()


def _last_holder(workflow_id: str) -> str | None:
    return WorkflowClaim.objects.filter(pk=workflow_id).values_list("last_engine_id", flat=True).first()


def _parked_then_stuck(weft_engines, name: str, stuck_type: str, marker: str, settings=None, parked: int = 1):
    """The first engine holding ``parked`` parked workflows and a ``stuck_type`` run (not stuck yet)."""
    waiting = [weft.start("tests.signals", id=f"{name}-parked-{n}") for n in range(parked)]
    stuck = weft.start(stuck_type, args=[marker, FOREVER], id=f"{name}-stuck")
    first = weft_engines(f"{name}-first", weft={**FAST, **(settings or {})})
    ids = [h.id for h in waiting] + [stuck.id]
    wait_for(
        lambda: all(_holder(wid) == f"{name}-first" for wid in ids),
        timeout=60,
        message="the first engine holds (and has loaded) them all",
    )
    return first, waiting, stuck


def _hands_over(weft_engines, name: str, first, waiting, stuck, marker: str, where: str) -> None:
    wait_for(lambda: os.path.exists(marker), timeout=60, message="the first engine's loop stuck")
    second = weft_engines(f"{name}-second", weft=FAST)
    for handle in waiting:
        handle.signal("go", "moved")
    for handle in waiting:
        assert handle.result(timeout=90) == "moved", first.output()[-3000:]
        assert _last_holder(handle.id) == f"{name}-second"
    log = first.output()
    assert f"engine loop stuck engine={name}-first" in log, log[-3000:]
    line = log.split("engine loop stuck", 1)[1].split("\n", 1)[0]
    assert f"workflow={stuck.id} " in line, line
    assert where in line, line
    assert _holder(stuck.id) == f"{name}-first", "the stuck workflow stays with the engine stuck in it"
    assert stuck.describe()["status"] == "running"
    first.kill()
    second.stop()


def test_stuck_in_workflow_code_of_a_live_turn(weft_engines, tmp_path) -> None:
    marker = str(tmp_path / "held")
    first, waiting, stuck = _parked_then_stuck(weft_engines, "sw-code", "tests.stuck_code", marker)
    stuck.signal("go", "spin")
    _hands_over(weft_engines, "sw-code", first, waiting, stuck, marker, "spin_in_workflow_code")


def test_stuck_in_a_replay_on_load(weft_engines, tmp_path) -> None:
    """The stuck run is replayed when the first engine loads it (its history is the activity's step):
    it is in the loop's dict before its replay, so its claim is the one kept; it does not hop."""
    marker = str(tmp_path / "held")
    parked = weft.start("tests.signals", id="sw-replay-parked")
    stuck = weft.start("tests.stuck_replay", args=[marker, FOREVER], id="sw-replay-stuck")
    zeroth = weft_engines("sw-replay-zeroth", weft=FAST)
    wait_for(lambda: Step.objects.filter(workflow_id=stuck.id, status="completed").exists(), timeout=60)
    zeroth.stop()  # releases both: the first engine loads them, and replays the stuck one
    first = weft_engines("sw-replay-first", weft=FAST)
    wait_for(lambda: os.path.exists(marker), timeout=60, message="the first engine's loop stuck in the replay")
    wait_for(lambda: _holder(parked.id) is not None, timeout=60, message="the parked one claimed")
    _hands_over(weft_engines, "sw-replay", first, [parked], stuck, marker, "spin_in_workflow_code")


@pytest.fixture(autouse=True)
def _end_waits():
    """Calls left waiting in the background (on an engine killed while stuck) end with the test."""
    yield
    close_connections()


def _in_background(call) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(Exception):  # the engine is killed while the call waits
            call()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("update", ["hold", "checked"])
def test_stuck_in_an_update_handler_or_validator(weft_engines, tmp_path, update) -> None:
    marker = str(tmp_path / "held")
    name = f"sw-{update}"
    first, waiting, stuck = _parked_then_stuck(weft_engines, name, "tests.stuck_handlers", marker)
    _in_background(lambda: stuck.update(update, 1, timeout=120))
    _hands_over(weft_engines, name, first, waiting, stuck, marker, "block_in_handler")


def test_stuck_in_a_query_handler(weft_engines, tmp_path) -> None:
    marker = str(tmp_path / "held")
    first, waiting, stuck = _parked_then_stuck(weft_engines, "sw-query", "tests.stuck_handlers", marker)
    _in_background(lambda: stuck.query("peek", timeout=120))
    _hands_over(weft_engines, "sw-query", first, waiting, stuck, marker, "block_in_handler")


def test_stuck_in_a_cancel_handler(weft_engines, tmp_path) -> None:
    """The cancel ends the run at once (durable); its handler runs on the engine that held it, and holds
    that engine's loop: the other workflows go to the peer."""
    marker = str(tmp_path / "held")
    first, waiting, stuck = _parked_then_stuck(weft_engines, "sw-cancel", "tests.stuck_handlers", marker)
    stuck.cancel("stop")
    wait_for(lambda: os.path.exists(marker), timeout=60, message="the first engine's loop stuck")
    second = weft_engines("sw-cancel-second", weft=FAST)
    waiting[0].signal("go", "moved")
    assert waiting[0].result(timeout=90) == "moved", first.output()[-3000:]
    assert _last_holder(waiting[0].id) == "sw-cancel-second"
    line = first.output().split("engine loop stuck", 1)[1].split("\n", 1)[0]
    assert f"workflow={stuck.id} " in line and "block_in_handler" in line, line
    assert stuck.describe()["status"] == "cancelled"
    first.kill()
    second.stop()


def test_evicted_workflows_are_handed_over_too(weft_engines, tmp_path) -> None:
    """MAX_RESIDENT_WORKFLOWS 1: the parked ones are evicted (dormant claims, kept by the heartbeat a
    stuck engine no longer writes); the peer takes them over and ends them."""
    marker = str(tmp_path / "held")
    first, waiting, stuck = _parked_then_stuck(
        weft_engines, "sw-dormant", "tests.stuck_code", marker, settings={"MAX_RESIDENT_WORKFLOWS": 1}, parked=3
    )
    stuck.signal("go", "spin")  # it is loaded again, and its turn holds the loop
    _hands_over(weft_engines, "sw-dormant", first, waiting, stuck, marker, "spin_in_workflow_code")


def test_a_second_sigterm_ends_a_stuck_engine_and_a_peer_finishes_the_stuck_run(weft_engines, tmp_path) -> None:
    marker = str(tmp_path / "held")
    first, waiting, stuck = _parked_then_stuck(weft_engines, "sw-term", "tests.stuck_code", marker)
    stuck.signal("go", "spin")
    wait_for(lambda: "engine loop stuck" in first.output(), timeout=60, message="the stuck loop reported")
    first.terminate()
    wait_for(lambda: "draining engine=sw-term-first" in first.output(), timeout=30, message="the first SIGTERM read")
    assert first.process.poll() is None, "a stuck loop does not drain"
    first.terminate()
    assert first.wait(30) == 1, first.output()[-3000:]
    assert "weft_engine: forced exit" in first.output()
    second = weft_engines("sw-term-second", weft=FAST)
    waiting[0].signal("go", "moved")
    assert waiting[0].result(timeout=90) == "moved"
    assert stuck.result(timeout=90) == "spin", "the marker exists: the peer's turn returns at once"
    assert _last_holder(stuck.id) == "sw-term-second"
    second.stop()


def test_lease_mode_keeps_renewing(weft_engines, tmp_path) -> None:
    """OWNERSHIP="lease": the lease holder stuck for longer than twice the claim TTL keeps everything
    (a standby would be held the same way); when the turn returns, it ends both runs itself."""
    lease = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s", "LEASE_WAIT_TIMEOUT": "120s"}
    marker = str(tmp_path / "held")
    parked = weft.start("tests.signals", id="sw-lease-parked")
    stuck = weft.start("tests.stuck_code", args=[marker, 12.0], id="sw-lease-stuck")
    first = weft_engines("sw-lease-first", weft={**FAST, **lease})
    wait_for(lambda: _holder(stuck.id) == "sw-lease-first", timeout=60)
    stuck.signal("go", "spin")
    wait_for(lambda: os.path.exists(marker), timeout=60, message="the first engine's loop stuck")
    second = weft_engines("sw-lease-second", weft={**FAST, **lease})
    parked.signal("go", "stayed")
    assert stuck.result(timeout=90) == "spin"
    assert parked.result(timeout=90) == "stayed"
    assert _last_holder(parked.id) == "sw-lease-first" and _last_holder(stuck.id) == "sw-lease-first"
    assert "engine loop stuck" not in first.output()
    assert "store lease acquired engine=sw-lease-second" not in second.output()
    first.stop()
    second.stop()


def test_stuck_in_a_statement_of_the_fenced_commit(weft_engines) -> None:
    """A statement of the loop's fenced commit that does not end (a trigger sleeping here: lock waits
    end at lock_timeout, other slow statements do not) is no workflow's: the report names none and keeps
    no claim; the workflows outside that commit go to the peer, and the commit, once it ends, stands."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION sw_slow_step() RETURNS trigger AS $$ BEGIN IF NEW.workflow_id = 'sw-db-stuck' "
            "THEN PERFORM pg_sleep(25); END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE TRIGGER sw_slow_step BEFORE INSERT ON weft_django_step FOR EACH ROW EXECUTE FUNCTION sw_slow_step()"
        )
    try:
        parked = weft.start("tests.signals", id="sw-db-parked")
        stuck = weft.start("tests.signals", id="sw-db-stuck")
        first = weft_engines("sw-db-first", weft=FAST)
        wait_for(lambda: _holder(parked.id) == _holder(stuck.id) == "sw-db-first", timeout=60)
        stuck.signal("go", "slow")
        wait_for(lambda: "engine loop stuck" in first.output(), timeout=60, message="the stuck loop reported")
        second = weft_engines("sw-db-second", weft=FAST)
        parked.signal("go", "moved")
        assert parked.result(timeout=90) == "moved"
        assert _last_holder(parked.id) == "sw-db-second"
        assert stuck.result(timeout=90) == "slow"
        line = first.output().split("engine loop stuck", 1)[1].split("\n", 1)[0]
        assert "workflow=None " in line, line
        first.stop()
        second.stop()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS sw_slow_step ON weft_django_step")
            cursor.execute("DROP FUNCTION IF EXISTS sw_slow_step()")
