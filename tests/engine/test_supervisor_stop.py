"""Stopping weft_engine (--processes N or one engine) by signals at awkward moments: real subprocesses
and real signals, the moment forced by a settings module that wraps ``os.fork`` in the supervisor, or
``threading.Condition.wait`` on the engine loop's thread."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

import weft_django as weft
from tests.engine.test_engine_processes import gone, live
from tests.testapp.models import ActivityCall
from weft_django.models import Engine, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]
ROOT = Path(__file__).resolve().parents[2]
FAST = json.dumps({"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"})

# The supervisor's fork number SIGNAL_AT sends the supervisor SIGTERM right after the fork returns in
# it, and sleeps so that the handler runs there: before the supervisor has recorded the new child.
HOOK = """
import os, signal, time
from tests.settings import *  # noqa

_fork, _state = os.fork, {"pid": None, "forks": 0}
SIGNAL_AT = int(os.environ["WEFT_TEST_SIGNAL_AT_FORK"])


def _forked_then_signalled():
    if _state["pid"] is None:
        _state["pid"] = os.getpid()
    pid = _fork()
    if pid and os.getpid() == _state["pid"]:
        _state["forks"] += 1
        if _state["forks"] == SIGNAL_AT:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
    return pid


os.fork = _forked_then_signalled
"""


def hooked(tmp_path: Path, signal_at: int) -> dict[str, str]:
    (tmp_path / "fork_hook_settings.py").write_text(HOOK)
    return {
        "DJANGO_SETTINGS_MODULE": "fork_hook_settings",
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "WEFT_TEST_SIGNAL_AT_FORK": str(signal_at),
        "WEFT_TEST_OVERRIDES": FAST,
    }


def alive(prefix: str) -> dict[str, int]:
    return {engine: pid for engine, pid in live(prefix).items() if not gone(pid)}


def test_a_child_restarted_as_the_stop_arrives_is_stopped_too(weft_engines, tmp_path):
    # SIGTERM handled between the fork of a restarted child and the supervisor recording its pid and
    # pipe: the child was never told to stop, kept driving workflows, and the supervisor waited for it
    # for ever. (Found by a helper's review, rev1.)
    supervisor = weft_engines("late", "--processes", "2", env=hooked(tmp_path, 3))  # fork 3: the restart
    seen: set[int] = set()
    try:
        wait_for(lambda: len(live("late")) == 2, timeout=30, message="two engines")
        os.kill(live("late")["late-1"], signal.SIGKILL)
        wait_for(lambda: "draining 2 engine processes" in supervisor.output(), timeout=30, message="the stop")
        try:
            code = supervisor.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        seen.update(live("late").values())
        assert code == 0, f"the supervisor still waits for its children, alive: {alive('late')}"
        wait_for(lambda: all(gone(pid) for pid in seen), timeout=10, message="children gone")
    finally:
        for pid in seen | set(live("late").values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_stop_while_the_children_are_first_forked_drains_them(weft_engines, tmp_path):
    # SIGTERM between the first fork and the supervisor's handlers: the default action killed the
    # supervisor at once (status -15), without waiting for its children to drain. (rev1)
    supervisor = weft_engines("early", "--processes", "2", env=hooked(tmp_path, 1))
    try:
        assert supervisor.wait(timeout=30) == 0
        assert "draining 2 engine processes" in supervisor.output()
        assert Engine.objects.filter(id__startswith="early").count() <= 1  # the second was never forked
        assert alive("early") == {}
    finally:
        for pid in live("early").values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# The engine's idle wait number WAIT_AT (a main-thread Wake.wait) gets SIGTERM while it holds the
# lock of the wake-up Event's condition, as a signal arriving there would: the handler runs on that
# thread before the lock is let go.
WAIT_HOOK = """
import os, signal, sys, threading, time
from tests.settings import *  # noqa

_wait, _state = threading.Condition.wait, {"waits": 0}
WAIT_AT = int(os.environ["WEFT_TEST_SIGNAL_AT_WAIT"])


def _signalled_holding_the_lock(self, timeout=None):
    caller = sys._getframe(2).f_code.co_filename
    if threading.current_thread() is threading.main_thread() and caller.endswith(os.path.join("engine", "wake.py")):
        _state["waits"] += 1
        if _state["waits"] == WAIT_AT:
            os.write(2, b"hook: SIGTERM inside the wake-up wait\\n")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
    return _wait(self, timeout)


threading.Condition.wait = _signalled_holding_the_lock
"""


def signalled_in_wait(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "wait_hook_settings.py").write_text(WAIT_HOOK)
    return {
        "DJANGO_SETTINGS_MODULE": "wait_hook_settings",
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "WEFT_TEST_SIGNAL_AT_WAIT": "20",
        "WEFT_TEST_OVERRIDES": FAST,
    }


def test_a_sigterm_while_the_loop_holds_a_lock_of_its_wake_up_still_drains(weft_engines, tmp_path):
    # The SIGTERM handler called engine.request_stop() on the loop's own thread: Event.set() takes the
    # Event's lock, which that thread held (inside Event.wait): the engine hung, never drained, and
    # only a second signal ended it (exit 1, claims left to lapse). (rev1)
    engine = weft_engines("locked-stop", env=signalled_in_wait(tmp_path))
    wait_for(lambda: "draining engine=locked-stop" in engine.output(), timeout=30, message="the signal")
    try:
        code = engine.wait(timeout=20)
    except subprocess.TimeoutExpired:
        code = None
    assert code == 0, "the engine hung in its SIGTERM handler"
    assert Engine.objects.get(id="locked-stop").stopped_at is not None


def test_an_engine_process_own_sigterm_while_its_loop_holds_a_lock_still_drains(weft_engines, tmp_path):
    # The same in an engine process under --processes (systemd signals the whole control group): the
    # process hung, and so did its supervisor's later stop (the pipe thread's request_stop waited for
    # the same lock). (rev1)
    supervisor = weft_engines("locked-procs", "--processes", "2", env=signalled_in_wait(tmp_path))
    pids: set[int] = set()
    try:
        wait_for(lambda: len(live("locked-procs")) == 2, timeout=30, message="two engines")
        pids.update(live("locked-procs").values())
        hooked_twice = lambda: supervisor.output().count("hook: SIGTERM inside the wake-up wait") == 2  # noqa: E731
        wait_for(hooked_twice, timeout=30, message="each engine process signalled")
        supervisor.terminate()
        try:
            code = supervisor.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"engine processes hung in their SIGTERM handler: {alive('locked-procs')}"
        assert alive("locked-procs") == {}
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_an_engine_process_that_dies_while_draining_is_reported(weft_engines):
    # An engine process killed during the drain (the OOM killer, a crash) left its claims to lapse,
    # and the supervisor said nothing: its log read as a clean drain of every engine. (rev1)
    weft.start("tests.slow", args=["dies-draining", 1, 30], id="dies-draining")
    supervisor = weft_engines("dying", "--processes", "2", "--drain-timeout", "60", env={"WEFT_TEST_OVERRIDES": FAST})
    wait_for(lambda: ActivityCall.objects.filter(key="dies-draining-0").exists(), timeout=30, message="activity")
    holder = WorkflowClaim.objects.get(workflow_id="dies-draining").engine_id
    supervisor.terminate()
    wait_for(lambda: "draining 2 engine processes" in supervisor.output(), timeout=30, message="the stop")
    pid = live("dying")[holder]
    os.kill(pid, signal.SIGKILL)
    assert supervisor.wait(timeout=30) == 0
    slot = holder.rsplit("-", 1)[1]
    assert f"engine process {slot} (pid {pid}) exited with status -9 while stopping" in supervisor.output()
