"""A stuck loop's hand-over around the stuck call (engine/stall.py): an update batch the stuck handler
shares with another workflow, two stuck calls in one pass, the pass that ends, and a long pass of short
calls that is no stuck loop at all."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import pytest

import weft_django as weft
from tests.ownership.test_stuck_loop import FAST, _holder, _last_holder
from tests.testapp.models import ActivityCall
from weft_django.models import PendingUpdate, Step
from weft_django.testing import wait_for
from weft_django.waits import close_connections

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _end_waits():
    """Calls left waiting in the background (on an engine killed while stuck) end with the test."""
    yield
    close_connections()


def _in_background(call) -> None:
    def run() -> None:
        with contextlib.suppress(Exception):  # the engine is killed while the call waits
            call()

    threading.Thread(target=run, daemon=True).start()


def _calls(key: str) -> int:
    return ActivityCall.objects.filter(key=key).count()


def test_a_workflow_whose_update_shares_the_stuck_handlers_batch_is_handed_over(weft_engines, tmp_path) -> None:
    """Two workflows' updates settled in one pass share one fenced transaction (engine/messages.py), which
    locks both claims while the handlers run; the first handler does not return. The other workflow's
    claim must not stay locked with it: a peer takes it over and ends it."""
    marker = str(tmp_path / "held")
    stuck = weft.start("tests.stuck_handlers", args=[marker, 600.0], id="sa-batch-stuck")
    other = weft.start("tests.stuck_handlers", args=[str(tmp_path / "other"), 600.0], id="sa-batch-other")
    # Both admitted before any engine runs: the engine loads both runs, and its next pass looks at both
    # mailboxes (new contexts) and settles both updates.
    _in_background(lambda: other.update("note", 1, timeout=120))
    _in_background(lambda: stuck.update("hold", 1, timeout=120))
    wait_for(lambda: PendingUpdate.objects.filter(workflow_id__in=[stuck.id, other.id]).count() == 2, timeout=30)
    first = weft_engines("sa-batch-first", weft=FAST)
    wait_for(lambda: os.path.exists(marker), timeout=60, message="the first engine's loop stuck in the handler")
    second = weft_engines("sa-batch-second", weft=FAST)
    other.signal("go", "moved")
    assert other.result(timeout=90) == "moved", first.output()[-3000:]
    assert _last_holder(other.id) == "sa-batch-second"
    assert _holder(stuck.id) == "sa-batch-first"
    first.kill()
    second.stop()


def test_two_stuck_calls_in_one_pass(weft_engines, tmp_path) -> None:
    """Both runs are woken in one pass (their signals came before their load): the first turn
    holds the loop for a while and returns, the second then does not. Each is reported once; once the
    loop has moved on, the first one's claim is no longer kept, and a peer ends it."""
    markers, seconds = [str(tmp_path / "one"), str(tmp_path / "two")], [9.0, 600.0]
    runs = [weft.start("tests.stuck_in_turn", args=[markers, seconds], id=f"sa-two-{n}") for n in range(2)]
    for handle in runs:  # buffered before any engine runs: the pass after their load delivers both
        handle.signal("go", handle.id)
    first = weft_engines("sa-two-first", weft=FAST)
    wait_for(lambda: os.path.getsize(markers[0]) if os.path.exists(markers[0]) else 0, timeout=60)
    second = weft_engines("sa-two-second", weft=FAST)
    wait_for(lambda: os.path.getsize(markers[1]) if os.path.exists(markers[1]) else 0, timeout=60)
    earlier, later = (Path(marker).read_text() for marker in markers)
    assert weft.get_handle(earlier).result(timeout=90) == earlier
    assert _last_holder(earlier) == "sa-two-second", "a peer ended the first once the loop moved on"
    assert _holder(later) == "sa-two-first"
    log = first.output()
    assert log.count("engine loop stuck engine=sa-two-first") == 2, log[-3000:]
    assert log.count(f"workflow={earlier} ") == 1 and log.count(f"workflow={later} ") == 1, log[-3000:]
    first.kill()
    second.stop()


def test_after_the_stuck_pass_ends_the_engine_drives_none_of_what_peers_took(weft_engines, tmp_path) -> None:
    """The stuck local step returns once a peer has taken the other runs over and ended them (their
    sleep's timer fired there: a local and a regular step each). The first engine, its pass over, holds
    their timers too, due by now: it must not drive them again (each step ran once, committed once)."""
    marker, release = str(tmp_path / "held"), str(tmp_path / "release")
    counted = [weft.start("tests.counted_steps", args=[f"sa-end-{n}", 12.0], id=f"sa-end-{n}") for n in range(3)]
    first = weft_engines("sa-end-first", weft=FAST)
    wait_for(lambda: all(_holder(h.id) == "sa-end-first" for h in counted), timeout=60)
    stuck = weft.start("tests.stuck_until", args=[marker, release], id="sa-end-stuck")
    wait_for(lambda: os.path.exists(marker), timeout=60, message="the first engine's loop stuck")
    second = weft_engines("sa-end-second", weft=FAST)
    for handle in counted:
        assert handle.result(timeout=90) == [f"{handle.id}:local", f"{handle.id}:remote"]
        assert _last_holder(handle.id) == "sa-end-second"
    open(release, "w").close()
    assert stuck.result(timeout=90) == "held the loop"
    assert _last_holder(stuck.id) == "sa-end-first"
    first.stop()
    second.stop()
    for handle in counted:
        assert (_calls(f"{handle.id}:local"), _calls(f"{handle.id}:remote")) == (1, 1), first.output()[-3000:]
        seqs = list(Step.objects.filter(workflow_id=handle.id).values_list("seq", flat=True))
        assert len(seqs) == len(set(seqs)) == 3


def test_a_long_pass_of_short_local_steps_is_no_stuck_loop(weft_engines) -> None:
    """Twenty runs wake in one pass and each runs a local step of 0.4 s: the pass lasts 8 s, four times
    the claim TTL of 2 s, but no call in it lasts long. The engine is loaded, not stuck: it must keep
    its claims (a peer is running), so every local step runs once and the engine ends every run."""
    fast = {"WORKFLOW_CLAIM_TTL": "2s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "500ms", "POLL_INTERVAL": "200ms"}
    at = time.time() + 30
    handles = [weft.start("tests.brief_local_at", args=[f"sa-load-{n}", at, 0.4], id=f"sa-load-{n}") for n in range(20)]
    first = weft_engines("sa-load-first", weft=fast)
    wait_for(lambda: all(_holder(h.id) == "sa-load-first" for h in handles), timeout=60, message="all held")
    assert time.time() < at - 3, "the engine took too long to start: the test needs them parked"
    second = weft_engines("sa-load-second", weft=fast)
    for handle in handles:
        assert handle.result(timeout=90) == handle.id
    first.stop()
    second.stop()
    assert "engine loop stuck" not in first.output(), first.output()[-3000:]
    assert [_calls(h.id) for h in handles] == [1] * 20
    assert {_last_holder(h.id) for h in handles} == {"sa-load-first"}


def test_the_rest_of_the_stuck_pass_drives_none_of_what_peers_took(weft_engines, tmp_path) -> None:
    """One pass delivers the other run's signal, then settles an update whose handler holds the loop
    for 20 s (both came before the runs were loaded: the pass after their load does both). A peer takes
    the other run over and ends it (its local and regular step). When the handler returns, the same pass
    goes on to advance the other run, whose signal it delivered: it must not, since a peer took it over
    (its local step ran twice)."""
    marker = str(tmp_path / "held")
    stuck = weft.start("tests.stuck_handlers", args=[marker, 20.0], id="sa-pass-stuck")
    other = weft.start("tests.counted_after_signal", args=["sa-pass-other"], id="sa-pass-other")
    other.signal("go", 1)
    _in_background(lambda: stuck.update("hold", 1, timeout=120))
    wait_for(lambda: PendingUpdate.objects.filter(workflow_id=stuck.id).exists(), timeout=30)
    first = weft_engines("sa-pass-first", weft=FAST)
    wait_for(lambda: os.path.exists(marker), timeout=60, message="the first engine's loop stuck in the handler")
    assert _calls("sa-pass-other:local") == 0, "the test needs the other run's turn after the handler"
    second = weft_engines("sa-pass-second", weft=FAST)
    assert other.result(timeout=90) == ["sa-pass-other:local", "sa-pass-other:remote"]
    assert _last_holder(other.id) == "sa-pass-second"
    wait_for(lambda: PendingUpdate.objects.get(workflow_id=stuck.id).status == "completed", timeout=60)
    wait_for(lambda: "stopped driving workflow=sa-pass-other" in first.output(), timeout=30)
    first.stop()
    second.stop()
    calls = (_calls("sa-pass-other:local"), _calls("sa-pass-other:remote"))
    assert calls == (1, 1), first.output()[-3000:]
