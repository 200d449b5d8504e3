"""A backlog of buffered signals taken in the settle cascade of one pass (``signal_delivery.deliver_known``,
b9952a5) under the interleavings that could break it (review of b9952a5; each passed when written, kept
as coverage): every signal is consumed exactly once, in the order sent, whatever happens between the
pass and its commit, and the history replays.

- the pass's commit deferred (a user's transaction holds the claim row), more signals and a forced
  mailbox read meanwhile;
- another engine takes the claim over between the pass and its commit (the fence refuses it all);
- the workflow evicted between backlogs, recalled by each;
- continue-as-new with a backlog (carried to the next runs);
- ``ctx.all`` of several waits over two names, interleaved;
- a child's end and a signal in one ``ctx.all``;
- waits with a timeout (0, and shorter than the test): no timer left, none fired;
- more records than the cascade's MAX_ROUNDS (the rest goes on in the next pass).

PostgreSQL: a context knows its mailbox there. The commits are counted (``xmin``) only to show that the
backlog went through the cascade (few commits), not asserted.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

import weft_django as weft
from weft_django.engine import cascade
from weft_django.engine import engine as engine_module
from weft_django.engine.engine import Engine
from weft_django.models import BufferedSignal, Step, Timer, Workflow, WorkflowClaim
from weft_django.store.claims import expire_claims
from weft_django.testing import replay

from .test_commit_locks import holding
from .test_signal_backlog_passes import collecting as collect  # one signal wait after another
from .ticking import tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
QUIET = {"POLL_INTERVAL": "60s"}  # no maintenance pass: wake-ups and armed waits drive the engine


@weft.workflow(name="tests.kmr_collect_t0")
def collect_t0(ctx: Any, n: int) -> Any:
    seen = []
    for _ in range(n):
        seen.append((yield ctx.wait_for_signal("item", timeout=0)))
    return seen


@weft.workflow(name="tests.kmr_collect_short")
def collect_short(ctx: Any, n: int) -> Any:
    seen = []
    for _ in range(n):
        try:
            seen.append((yield ctx.wait_for_signal("item", timeout="300ms")))
        except weft.WaitTimeoutError:
            seen.append("timed out")
    return seen


@weft.workflow(name="tests.kmr_triples")
def triples(ctx: Any, n: int) -> Any:
    seen = []
    for _ in range(n):
        seen.append((yield ctx.all([ctx.wait_for_signal("a"), ctx.wait_for_signal("b"), ctx.wait_for_signal("a")])))
    return seen


@weft.workflow(name="tests.kmr_continuing")
def continuing(ctx: Any, per_run: int, total: int, seen: list[Any]) -> Any:
    for _ in range(per_run):
        seen = [*seen, (yield ctx.wait_for_signal("item"))]
        if len(seen) == total:
            return seen
    return (yield ctx.continue_as_new(per_run, total, seen))


@weft.workflow(name="tests.kmr_child")
def child(ctx: Any, i: int) -> Any:
    yield ctx.sleep(0)
    return i * 10


@weft.workflow(name="tests.kmr_parent")
def parent(ctx: Any, n: int) -> Any:
    seen = []
    for i in range(n):
        seen.append((yield ctx.all([ctx.start_child(child, args=[i], id=f"kmr-kid-{i}"), ctx.wait_for_signal("item")])))
    return seen


def _settled(engine_id: str) -> Engine:
    """A started engine past its first passes (the listener's connect, a rescan, served)."""
    engine = Engine(engine_id, concurrency=2)
    engine.start()
    for _ in range(3):
        engine.tick(claim=False)
    time.sleep(0.3)
    for _ in range(2):
        engine.tick(claim=False)
    return engine


def _arrived(engine: Engine, wid: str, n: int) -> None:
    """Wait (no pass) until the ``S:`` wake-ups of ``n`` signals to ``wid`` reached ``engine``."""
    deadline = time.monotonic() + 10
    while len(engine.wake.carried.get(wid, [])) < n:
        assert time.monotonic() < deadline, "the signals' wake-ups did not arrive"
        time.sleep(0.01)


def _ended(wid: str) -> bool:
    return Workflow.objects.filter(pk=wid).exclude(status="running").exists()


def _signal_steps(wid: str) -> int:
    return Step.objects.filter(workflow_id=wid, kind="signal").count()


def _commits(wid: str) -> int:
    """How many transactions wrote this workflow's signal steps."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(DISTINCT xmin::text) FROM {Step._meta.db_table} WHERE workflow_id = %s AND kind = 'signal'",
            [wid],
        )
        return int(cursor.fetchone()[0])


def _replays(wid: str, workflow: Any) -> bool:
    out = io.StringIO()
    call_command("weft", "export", wid, stdout=out)
    return bool(replay(json.loads(out.getvalue()), workflow).ok)


def _all_consumed_once(wid: str, n: int) -> None:
    assert BufferedSignal.objects.filter(workflow_id=wid, state="consumed").count() == n
    assert not BufferedSignal.objects.filter(workflow_id=wid).exclude(state="consumed").exists()
    consumed_by = BufferedSignal.objects.filter(workflow_id=wid).values_list("consumed_seq", flat=True)
    assert len(set(consumed_by)) == n, "two signals consumed by one step"


def _run(engine: Engine, workflow: Any, wid: str, args: list[Any], sends: list[tuple[str, Any]]) -> Any:
    """Start ``workflow``, buffer ``sends`` before any engine loads it, run it to its end on ``engine``."""
    handle = weft.start(workflow, args=args, id=wid)
    for name, payload in sends:
        handle.signal(name, payload)
    tick_until(engine, lambda: _ended(wid), f"{wid} ended", timeout=120)
    return handle.result(timeout=5)


@override_settings(WEFT=QUIET)
def test_a_backlog_whose_commit_is_deferred_is_consumed_once_with_more_signals_and_a_read_meanwhile() -> None:
    n = 30
    engine = _settled("kmr-deferred")
    try:
        handle = weft.start(collect, args=[n], id="kmr-deferred")
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].armed, "parked")
        with holding("SELECT 1 FROM weft_django_workflowclaim WHERE workflow_id = %s FOR UPDATE", [handle.id]):
            for i in range(n // 2):
                handle.signal("item", i)
            tick_until(engine, lambda: handle.id in engine._carried, "the consuming commit deferred")
            engine.wake.look_at(handle.id)  # a read: it sees the consumed ones still buffered
            for i in range(n // 2, n):
                handle.signal("item", i)
            for _ in range(8):
                engine.tick()
                time.sleep(0.02)
            assert _signal_steps(handle.id) == 0  # nothing durable while the row is held
        tick_until(engine, lambda: _ended(handle.id), "its end")
        assert handle.result(timeout=5) == list(range(n))
        assert _signal_steps(handle.id) == n
        _all_consumed_once(handle.id, n)
    finally:
        engine.shutdown()


@override_settings(WEFT=QUIET)
def test_a_takeover_between_the_pass_and_its_commit_refuses_the_backlog_and_the_new_owner_takes_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 25
    first, peer = _settled("kmr-first"), _settled("kmr-peer")
    try:
        handle = weft.start(collect, args=[n], id="kmr-takeover")
        tick_until(first, lambda: handle.id in first.owned and first.owned[handle.id].armed, "parked on first")
        real, taken_in_memory = engine_module.fenced_commit, []

        def taken_over_first(engine_id: str, batch: Any, *args: Any, **kwargs: Any) -> Any:
            if engine_id == "kmr-first" and not taken_in_memory and any(w.signals_consumed for w in batch):
                taken_in_memory.append(sum(len(w.signals_consumed) for w in batch))
                expire_claims(None, [handle.id], "default")
                peer.claimer.take_over_now = True
                peer.tick()  # the peer takes the claim (and may drive the run to its end) first
                assert WorkflowClaim.objects.get(pk=handle.id).last_engine_id == "kmr-peer"
            return real(engine_id, batch, *args, **kwargs)

        monkeypatch.setattr(engine_module, "fenced_commit", taken_over_first)
        for _ in range(3):
            first.tick()  # the load's admitted updates looked at: the cascade may take a backlog
        for i in range(n):
            handle.signal("item", i)
        _arrived(first, handle.id, n)
        tick_until(first, lambda: taken_in_memory, "the first engine's consuming commit")
        assert taken_in_memory[0] > 1  # the backlog went through its cascade
        assert handle.id not in first.owned, "the refused context is still driven"
        tick_until(peer, lambda: _ended(handle.id), "its end on the peer")
        assert handle.result(timeout=5) == list(range(n))
        assert _signal_steps(handle.id) == n
        _all_consumed_once(handle.id, n)
    finally:
        first.shutdown()
        peer.shutdown()


@override_settings(WEFT={"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1})
def test_workflows_evicted_between_backlogs_take_each_once_when_recalled() -> None:
    n, per_workflow = 15, 30
    engine = _settled("kmr-evicted")
    try:
        handles = [weft.start(collect, args=[per_workflow], id=f"kmr-evicted-{k}") for k in range(2)]
        sent = {h.id: 0 for h in handles}

        def one_evicted() -> bool:
            time.sleep(0.1)  # the eviction scan's retry after a short scan (residency.SHORT_SCAN_RETRY)
            left = [wid for wid in sent if not _ended(wid)]
            return not engine._reload and (len(engine.residency.evicted) == 1 or len(left) == 1)

        for k in range(4):
            tick_until(engine, one_evicted, f"one evicted ({k})")
            wid = next(iter(engine.residency.evicted), None) or next(w for w in sent if not _ended(w))
            if sent[wid] == per_workflow:
                wid = next(w for w in sent if w != wid)
            for _ in range(n):
                weft.get_handle(wid).signal("item", sent[wid])
                sent[wid] += 1
            count = sent[wid]
            tick_until(engine, lambda w=wid, c=count: _signal_steps(w) == c, f"backlog {k} taken")
        assert engine.residency.recalls >= 2
        for handle in handles:
            tick_until(engine, lambda h=handle: _ended(h.id), "its end")
            assert handle.result(timeout=5) == list(range(per_workflow))
            _all_consumed_once(handle.id, per_workflow)
    finally:
        engine.shutdown()


@override_settings(WEFT=QUIET)
def test_continue_as_new_carries_the_rest_of_a_backlog_in_order() -> None:
    total = 23
    engine = _settled("kmr-continue")
    try:
        result = _run(engine, continuing, "kmr-continue", [5, total, []], [("item", i) for i in range(total)])
        assert result == list(range(total))
        assert BufferedSignal.objects.filter(workflow_id="kmr-continue", state="consumed").count() == total
        assert not BufferedSignal.objects.filter(workflow_id="kmr-continue").exclude(state="consumed").exists()
    finally:
        engine.shutdown()


@override_settings(WEFT=QUIET)
def test_all_of_several_waits_takes_an_interleaved_backlog_in_order() -> None:
    n = 6
    sends = [pair for i in range(n) for pair in (("a", f"a{2 * i}"), ("b", f"b{i}"), ("a", f"a{2 * i + 1}"))]
    engine = _settled("kmr-triples")
    try:
        result = _run(engine, triples, "kmr-triples", [n], sends)
        assert result == [[f"a{2 * i}", f"b{i}", f"a{2 * i + 1}"] for i in range(n)]
        assert _commits("kmr-triples") < n  # taken in the cascade
        _all_consumed_once("kmr-triples", 3 * n)
        assert _replays("kmr-triples", triples)
    finally:
        engine.shutdown()


@override_settings(WEFT=QUIET)
def test_a_childs_end_and_a_signal_in_one_all_with_a_backlog() -> None:
    n = 5
    engine = _settled("kmr-parent")
    try:
        result = _run(engine, parent, "kmr-parent", [n], [("item", i) for i in range(n)])
        assert result == [[i * 10, i] for i in range(n)]
        assert not BufferedSignal.objects.filter(workflow_id="kmr-parent").exclude(state="consumed").exists()
        assert _replays("kmr-parent", parent)
    finally:
        engine.shutdown()


@override_settings(WEFT=QUIET)
@pytest.mark.parametrize("workflow", [collect_t0, collect_short], ids=["timeout-0", "timeout-300ms"])
def test_waits_with_a_timeout_take_a_backlog_and_leave_no_timer(workflow: Any) -> None:
    n = 40
    wid = f"kmr-timeout-{'0' if workflow is collect_t0 else 'short'}"
    engine = _settled(wid)
    try:
        assert _run(engine, workflow, wid, [n], [("item", i) for i in range(n)]) == list(range(n))
        assert _commits(wid) < n  # taken in the cascade
        assert not Timer.objects.filter(workflow_id=wid).exists()
        assert _replays(wid, workflow)
    finally:
        engine.shutdown()


@override_settings(WEFT=QUIET)
@pytest.mark.parametrize("rounds", [7, None], ids=["max-rounds-7", "max-rounds-default"])
def test_a_backlog_longer_than_max_rounds_goes_on_in_the_next_pass(
    rounds: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if rounds is not None:
        monkeypatch.setattr(cascade, "MAX_ROUNDS", rounds)
    n = 50 if rounds is not None else cascade.MAX_ROUNDS + 100
    wid = f"kmr-rounds-{rounds}"
    engine = _settled(wid)
    try:
        assert _run(engine, collect_short, wid, [n], [("item", i) for i in range(n)]) == list(range(n))
        assert _signal_steps(wid) == n
        assert not Timer.objects.filter(workflow_id=wid).exists()
        assert _replays(wid, collect_short)
    finally:
        engine.shutdown()
