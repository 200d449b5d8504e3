"""A wait the settle cascade arms takes its record from the known mailbox in the same pass
(``signal_delivery.deliver_known``, b9952a5), but never ahead of what the next pass would have
settled first for that workflow (review of b9952a5, which found each of these):

- an admitted update read with a context's load (or one parked until the frontier moves) is settled
  by the next pass after ONE record: it must not see the whole backlog consumed, signals sent after
  it was admitted included;
- a timer already due (the execution deadline of a run taken over late, a race's sleep due before its
  signal was sent, a race's ``sleep(0)``, a deadline passed while a local step ran) fires before any
  delivery: the run times out, the sleep wins, as before.

PostgreSQL: a context knows its mailbox there (the load's read and the rows of its ``S:`` wake-ups).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

import weft_django as weft
from weft_django.codec import decode, encode_payload
from weft_django.engine.engine import Engine
from weft_django.models import PendingUpdate, Workflow
from weft_django.store.claims import expire_claims

from .test_signal_backlog_passes import collecting as collect  # one signal wait after another
from .ticking import tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
QUIET = {"POLL_INTERVAL": "60s"}  # no maintenance pass: wake-ups and armed waits drive the engine


@weft.workflow(name="tests.kmo_counted")
def counted(ctx: Any, n: int, handler_at: int) -> Any:
    items: list[Any] = []
    for i in range(n):
        if i == handler_at:
            ctx.on_update("count", lambda _: list(items))
        items.append((yield ctx.wait_for_signal("item")))
    yield ctx.wait_for_signal("done")
    return items


@weft.workflow(name="tests.kmo_race_sleep")
def race_sleep(ctx: Any, seconds: float) -> Any:
    first = yield ctx.wait_for_signal("item")
    return [first, list((yield ctx.race([ctx.wait_for_signal("item"), ctx.sleep(seconds)])))]


@weft.activity(name="tests.kmo_slow_local", local=True)
def slow_local(seconds: float) -> str:
    time.sleep(seconds)
    return "slow"


@weft.workflow(name="tests.kmo_local_then_collect")
def local_then_collect(ctx: Any, n: int, seconds: float) -> Any:
    yield ctx.wait_for_signal("go")
    yield ctx.run(slow_local, seconds)
    seen = []
    for _ in range(n):
        seen.append((yield ctx.wait_for_signal("item")))
    return seen


def _settled(engine_id: str) -> Engine:
    """A started engine past its first passes (the listener's connect, a rescan, served): its next
    load is an ordinary pass's."""
    engine = Engine(engine_id, concurrency=2)
    engine.start()
    for _ in range(3):
        engine.tick(claim=False)
    time.sleep(0.3)
    for _ in range(2):
        engine.tick(claim=False)
    return engine


def _admit(wid: str, name: str) -> uuid.UUID:
    run_id = Workflow.objects.get(pk=wid).run_id
    payload, now = encode_payload(None), timezone.now()
    row = PendingUpdate.objects.create(
        id=uuid.uuid4(), workflow_id=wid, run_id=run_id, name=name, payload=payload, created_at=now
    )
    return row.id


def _seen_by(engine: Engine, update_id: uuid.UUID) -> Any:
    tick_until(engine, lambda: PendingUpdate.objects.get(pk=update_id).status == "completed", "the update settled")
    return decode(PendingUpdate.objects.get(pk=update_id).result)


def _finish(engine: Engine, handle: Any) -> Any:
    handle.signal("done", None)
    tick_until(engine, lambda: handle.status != "running", "its end")
    return handle.result(timeout=5)


@override_settings(WEFT=QUIET)
def test_an_update_read_with_the_load_sees_one_signal_taken_not_the_backlog() -> None:
    """Three signals, the update, seven more, all before an engine loads the run: the pass after the
    load takes one signal, then the update (as before b9952a5). Before the fix the load's own cascade
    took all ten, and the update saw [0, ..., 9]: seven signals sent after it was admitted."""
    engine = _settled("kmo-load")
    try:
        handle = weft.start(counted, args=[10, 0], id="kmo-load")
        for i in range(3):
            handle.signal("item", i)
        update = _admit(handle.id, "count")
        for i in range(3, 10):
            handle.signal("item", i)
        assert _seen_by(engine, update) == [0]
        assert _finish(engine, handle) == list(range(10))
    finally:
        engine.shutdown()


@override_settings(WEFT=QUIET)
def test_an_update_parked_until_its_handler_is_registered_is_settled_there() -> None:
    """The update is admitted before the code registers its handler (at the fourth wait): parked, it is
    settled in the pass whose signal moved the frontier there, having seen three signals (as before
    b9952a5). Before the fix the cascade took the whole backlog first: it saw [0, ..., 9]."""
    engine = _settled("kmo-parked")
    try:
        handle = weft.start(counted, args=[10, 3], id="kmo-parked")
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].armed, "the first wait")
        update = _admit(handle.id, "count")
        engine.wake.look_at(handle.id)
        for _ in range(3):
            engine.tick()
        assert PendingUpdate.objects.get(pk=update).status == "admitted"  # no handler yet: parked
        for i in range(10):
            handle.signal("item", i)
        assert _seen_by(engine, update) == [0, 1, 2]
        assert _finish(engine, handle) == list(range(10))
    finally:
        engine.shutdown()


def _taken_over(workflow: Any, wid: str, args: list[Any], **options: Any) -> tuple[Any, Engine]:
    """The run parked on an engine that then freezes; an hour passes; the caller sends the signals and
    returns, and another engine takes the claim over (its load an ordinary pass)."""
    first = _settled(f"{wid}-frozen")
    handle = weft.start(workflow, args=args, id=wid, **options)
    tick_until(first, lambda: handle.id in first.owned and first.owned[handle.id].armed, "parked")
    return handle, first


def _take_over(handle: Any, peer: Engine) -> None:
    expire_claims(None, [handle.id], "default")
    peer.claimer.take_over_now = True
    tick_until(peer, lambda: handle.status != "running", "its end on the peer")


@override_settings(WEFT=QUIET)
def test_a_run_taken_over_past_its_deadline_times_out_though_its_signals_are_buffered(weft_clock: Any) -> None:
    """Its deadline passed while its engine was frozen; then the signals that would complete it came.
    The new owner fires the deadline first (as before b9952a5). Before the fix its load's cascade took
    the signals and the run was 'completed' with [0, 1, 2]."""
    handle, frozen = _taken_over(collect, "kmo-deadline", [3], execution_timeout="60s")
    peer = _settled("kmo-deadline-peer")
    try:
        weft_clock.advance(3600)
        for i in range(3):
            handle.signal("item", i)
        _take_over(handle, peer)
        row = Workflow.objects.get(pk=handle.id)
        assert row.status == "timed_out", (row.status, row.result)
    finally:
        frozen.shutdown()
        peer.shutdown()


@override_settings(WEFT=QUIET)
def test_a_sleep_due_before_a_takeover_wins_its_race_over_a_signal_sent_after_it(weft_clock: Any) -> None:
    """The race's 60 s sleep came due while the engine was frozen, and only then was the signal sent:
    the sleep wins (as before b9952a5). Before the fix the new owner's load delivered the signal first."""
    handle, frozen = _taken_over(race_sleep, "kmo-race", [60])
    peer = _settled("kmo-race-peer")
    try:
        handle.signal("item", "first")
        tick_until(frozen, lambda: frozen.owned[handle.id].timers, "the race armed")
        frozen.tick()
        weft_clock.advance(3600)
        handle.signal("item", "late")
        _take_over(handle, peer)
        assert handle.result(timeout=5) == ["first", [1, None]]
    finally:
        frozen.shutdown()
        peer.shutdown()


@override_settings(WEFT=QUIET)
def test_a_race_with_a_sleep_of_zero_is_won_by_the_sleep_as_before() -> None:
    """``sleep(0)`` is due when armed: the next pass fires it before it delivers, so it wins over a
    signal buffered before the race (before b9952a5, and on SQLite, always). Before the fix the
    cascade gave the race to the signal whenever the mailbox was known and no wake-up waited."""
    engine = _settled("kmo-race0")
    try:
        handle = weft.start(race_sleep, args=[0], id="kmo-race0")
        handle.signal("item", "first")
        handle.signal("item", "second")
        tick_until(engine, lambda: handle.status != "running", "its end")
        assert handle.result(timeout=5) == ["first", [1, None]]
    finally:
        engine.shutdown()


@override_settings(WEFT=QUIET)
def test_a_deadline_passed_while_a_local_step_ran_fires_before_the_backlog(weft_clock: Any) -> None:
    """A local step (run in the pass) ends past the run's deadline; the wait after it must not take the
    backlog in that pass: the next pass fires the deadline first, as before b9952a5."""
    engine = _settled("kmo-local")
    try:
        handle = weft.start(local_then_collect, args=[3, 4.0], id="kmo-local", execution_timeout="1h")
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].armed, "parked")
        for i in range(3):
            handle.signal("item", i)
        for _ in range(3):
            engine.tick()
        weft_clock.advance(3600 - 3)  # the deadline is 3 s away; the local step runs 4 s
        time.sleep(0.6)  # past the pass clock's reuse: the next pass reads the moved clock
        handle.signal("go", None)
        deadline = time.monotonic() + 10
        while handle.id not in engine.wake.carried:  # its S: wake-up arrived: the next pass delivers it
            assert time.monotonic() < deadline, "no wake-up for the signal"
            time.sleep(0.01)
        engine.tick()  # "go", the 4 s local step, the wait after it armed
        tick_until(engine, lambda: handle.status != "running", "its end")
        row = Workflow.objects.get(pk=handle.id)
        assert row.status == "timed_out", (row.status, row.result)
    finally:
        engine.shutdown()
