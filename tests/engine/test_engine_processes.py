"""weft_engine --processes N: N engines under one supervising command, as real subprocesses
receiving real signals (weft_django/management/engine_processes.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal

import pytest
from django.core.management import CommandError, call_command

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.management.engine_processes import child_engine_id, child_metrics_port
from weft_django.models import Engine, Workflow, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
FAST = {"WEFT_TEST_OVERRIDES": json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})}


def live(prefix: str) -> dict[str, int]:
    """{engine id: pid} of the engines whose id starts with ``prefix`` and that have not stopped."""
    return dict(Engine.objects.filter(id__startswith=prefix, stopped_at__isnull=True).values_list("id", "pid"))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_processes_share_the_work_and_one_sigterm_drains_them_all(weft_engines):
    supervisor = weft_engines("procs", "--processes", "2", env=FAST)
    wait_for(lambda: set(live("procs")) == {"procs-1", "procs-2"}, timeout=30, message="two engines")
    handles = [weft.start("tests.three_steps", args=[f"procs-{i}"]) for i in range(30)]
    for handle in handles:
        handle.result(timeout=60)
    pids = live("procs").values()
    supervisor.terminate()
    assert supervisor.wait(timeout=30) == 0
    assert live("procs") == {} and all(gone(pid) for pid in pids)
    assert not WorkflowClaim.objects.filter(engine_id__startswith="procs").exists()  # released
    assert "2 engine processes started" in supervisor.output()


def test_a_process_that_dies_is_started_again_under_a_new_id(weft_engines):
    supervisor = weft_engines("respawn", "--processes", "2", env=FAST)
    wait_for(lambda: len(live("respawn")) == 2, timeout=30, message="two engines")
    os.kill(live("respawn")["respawn-1"], signal.SIGKILL)
    wait_for(lambda: "respawn-1.1" in live("respawn"), timeout=30, message="engine 1 started again")
    assert weft.start("tests.three_steps", args=["after-respawn"]).result(timeout=60) is not None
    supervisor.terminate()
    assert supervisor.wait(timeout=30) == 0
    assert "engine process 1" in supervisor.output() and "exited with status -9" in supervisor.output()


def test_killing_the_supervisor_stops_its_engines(weft_engines):
    supervisor = weft_engines("orphans", "--processes", "2", env=FAST)
    wait_for(lambda: len(live("orphans")) == 2, timeout=30, message="two engines")
    pids = list(live("orphans").values())
    supervisor.kill()
    supervisor.wait()
    # Each child reads a pipe from the supervisor: its end of file makes the child drain and exit.
    wait_for(lambda: live("orphans") == {} and all(gone(pid) for pid in pids), timeout=30, message="children gone")


def test_a_second_signal_makes_every_process_exit_at_once(weft_engines):
    weft.start("tests.slow", args=["procs-force", 1, 30], id="procs-force")
    supervisor = weft_engines("forced-procs", "--processes", "2", "--drain-timeout", "60", env=FAST)
    wait_for(lambda: ActivityCall.objects.filter(key="procs-force-0").exists(), timeout=30, message="activity")
    pids = list(live("forced-procs").values())
    supervisor.send(signal.SIGINT)
    wait_for(lambda: "draining 2 engine processes" in supervisor.output(), timeout=30, message="first signal")
    supervisor.send(signal.SIGINT)
    assert supervisor.wait(timeout=30) == 1  # well before the 30 s activity or the 60 s drain
    wait_for(lambda: all(gone(pid) for pid in pids), timeout=10, message="children gone")
    assert Workflow.objects.get(pk="procs-force").status == "running"  # abandoned, taken over later


def test_once_with_processes_is_refused_before_anything_runs():
    out = io.StringIO()
    with pytest.raises(CommandError, match="--once runs one engine until nothing is runnable: drop --processes"):
        call_command("weft_engine", "--once", "--processes", "2", stdout=out)
    assert not Engine.objects.exists()


def test_a_process_count_below_one_is_refused():
    with pytest.raises(CommandError, match="processes"):
        call_command("weft_engine", "--processes", "0")
    assert not Engine.objects.exists()


def test_child_ids_and_ports():
    assert [child_engine_id("web", i, 0) for i in (1, 2)] == ["web-1", "web-2"]
    assert child_engine_id("web", 2, 3) == "web-2.3"  # a restart: a new engine, a new id
    assert child_engine_id(None, 1, 0) is None  # the engine's own default (host:pid:random)
    assert [child_metrics_port(9100, i) for i in (1, 2, 3)] == [9100, 9101, 9102]
    assert child_metrics_port(0, 2) == 0 and child_metrics_port(None, 2) is None


@pytest.mark.parametrize("mode", ["lease", "none"])
def test_processes_are_refused_in_the_modes_of_one_engine(weft_engines, mode):
    # "lease" lets one engine drive at a time: the others waited LEASE_WAIT_TIMEOUT, exited 1 and were
    # started again for ever (or, waiting less than QUICK_EXIT, made the supervisor stop the lease holder
    # too). "none" takes every other engine's claims at start-up: each child took its siblings' claims,
    # again at every restart. (Found by a helper's review, rev6.)
    supervisor = weft_engines(f"one-{mode}", "--processes", "2", weft={"OWNERSHIP": mode, "LEASE_WAIT_TIMEOUT": "2s"})
    try:
        assert supervisor.wait(timeout=20) == 1
    finally:
        for pid in live(f"one-{mode}").values():  # before the fix: the children it forked
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert f"OWNERSHIP={mode!r} runs one engine at a time" in supervisor.output()
    assert not Engine.objects.exists()  # refused before any engine started


def test_a_second_signal_ends_a_frozen_engine_process_too(weft_engines):
    # A child stopped (SIGSTOP, a stalled VM) never read the supervisor's word to exit: the supervisor
    # waited for it after its second signal as long as it stayed frozen. (Found by a helper's review, rev6.)
    supervisor = weft_engines("frozen-procs", "--processes", "2", env=FAST)
    wait_for(lambda: len(live("frozen-procs")) == 2, timeout=30, message="two engines")
    pids = list(live("frozen-procs").values())
    os.kill(pids[0], signal.SIGSTOP)
    try:
        supervisor.send(signal.SIGTERM)
        wait_for(lambda: "draining 2 engine processes" in supervisor.output(), timeout=30, message="first signal")
        supervisor.send(signal.SIGTERM)
        assert supervisor.wait(timeout=15) == 1
        wait_for(lambda: all(gone(pid) for pid in pids), timeout=10, message="children gone")
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
