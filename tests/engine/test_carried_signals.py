"""A signal's wake-up carries its row (``S:``, store/notify.py), and the engine holding the parked
workflow consumes it without reading the mailbox, but only when it can tell the row is still
buffered (engine/signal_delivery.py). A stale ``S:`` (a signal consumed already, by this context or
before it was loaded) must never be consumed a second time."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connections

import weft_django as weft
from weft_django.engine import messages, signal_delivery
from weft_django.engine.engine import Engine
from weft_django.models import BufferedSignal, Step, Workflow

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.carried_once")
def carried_once(ctx: Any) -> Any:
    return (yield ctx.wait_for_signal("go"))


@weft.workflow(name="tests.carried_then_sleep")
def carried_then_sleep(ctx: Any) -> Any:
    value = yield ctx.wait_for_signal("go")
    yield ctx.sleep("1h")
    return value


@weft.workflow(name="tests.carried_loop")
def carried_loop(ctx: Any) -> Any:
    while True:
        yield ctx.wait_for_signal("go")


@weft.workflow(name="tests.carried_twice")
def carried_twice(ctx: Any) -> Any:
    first = yield ctx.wait_for_signal("go")
    second = yield ctx.wait_for_signal("go")
    return [first, second]


class _Reads:
    """Counts the engine's mailbox reads (the real read runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = signal_delivery.histories.buffered_signals

        def counted(workflow_ids: list[str], using: str) -> Any:
            self.count += 1
            return real(workflow_ids, using)

        monkeypatch.setattr(signal_delivery.histories, "buffered_signals", counted)
        self.updates = 0
        real_updates = messages.mailbox.admitted_updates

        def counted_updates(workflow_ids: list[str], using: str) -> Any:
            self.updates += 1
            return real_updates(workflow_ids, using)

        monkeypatch.setattr(messages.mailbox, "admitted_updates", counted_updates)


def _parked(engine: Engine, workflow_id: str, waits: int) -> None:
    """Tick until the workflow waits on its ``waits``-th signal and that wait's mailbox read is done."""

    def parked() -> bool:
        owned = engine.owned.get(workflow_id)
        return owned is not None and (owned.signal_top is not None or _on_sqlite(engine))  # SQLite: no top

    tick_until(engine, parked, "the workflow parked")
    tick_until(
        engine,
        lambda: Step.objects.filter(workflow_id=workflow_id, kind="signal").count() == waits - 1,
        "the earlier signals consumed",
    )
    for _ in range(3):
        engine.tick()


def _on_sqlite(engine: Engine) -> bool:
    return connections[engine.using].vendor == "sqlite"


def _stale_wake_up(signal: BufferedSignal) -> str:
    """The S: wake-up its sender's statement sent (the same row, as PostgreSQL's json_build_array renders it)."""
    row = [signal.pk, signal.workflow_id, str(signal.run_id), signal.name, signal.payload, signal.trace_context]
    return "S:" + json.dumps(row)


@pytest.mark.postgres  # the S: wake-up comes from LISTEN
def test_a_parked_workflow_takes_the_carried_signal_without_reading_its_mailbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle = weft.start(carried_once, id="carried-once")
    engine = Engine("carried-1", concurrency=2)
    engine.start()
    try:
        _parked(engine, handle.id, 1)
        reads = _Reads(monkeypatch)
        handle.signal("go", "fast")
        tick_until(engine, lambda: Workflow.objects.filter(pk=handle.id, status="completed").exists(), "its end")
        assert handle.result(timeout=5) == "fast"
        assert reads.count == 0, "the engine read the mailbox for a signal its wake-up carried"
        assert BufferedSignal.objects.get(workflow_id=handle.id).state == "consumed"
    finally:
        engine.shutdown()


@pytest.mark.postgres
def test_a_carried_signal_reads_neither_the_mailbox_nor_the_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Updates come with their own w: wake-ups: a workflow that only a signal's S: named, still open
    after it (asleep here), has no admitted update to look for."""
    handle = weft.start(carried_then_sleep, id="carried-sleep")
    engine = Engine("carried-5", concurrency=2)
    engine.start()
    try:
        _parked(engine, handle.id, 1)
        reads = _Reads(monkeypatch)
        handle.signal("go", "v")
        tick_until(
            engine, lambda: Step.objects.filter(workflow_id=handle.id, kind="signal").exists(), "the signal consumed"
        )
        for _ in range(3):
            engine.tick()
        assert (reads.count, reads.updates) == (0, 0)
    finally:
        engine.shutdown()


def test_a_stale_carried_signal_is_never_consumed_twice() -> None:
    handle = weft.start(carried_twice, id="carried-twice")
    engine = Engine("carried-2", concurrency=2)
    engine.start()
    try:
        _parked(engine, handle.id, 1)
        handle.signal("go", 1)
        _parked(engine, handle.id, 2)  # the first consumed; the second wait's mailbox read done
        first = BufferedSignal.objects.get(workflow_id=handle.id)
        assert first.state == "consumed"
        stale = _stale_wake_up(first)

        def consumed_once() -> None:
            for _ in range(3):
                engine.tick()
            assert Step.objects.filter(workflow_id=handle.id, kind="signal").count() == 1, "a signal consumed twice"
            assert Workflow.objects.get(pk=handle.id).status == "running"

        engine._on_notify(stale)  # late, to the context that consumed it
        consumed_once()
        engine.reload_all()  # a new context (as after an eviction or a takeover) ...
        _parked(engine, handle.id, 2)
        engine._on_notify(stale)  # ... then the same late wake-up
        consumed_once()
        handle.signal("go", 2)
        tick_until(engine, lambda: Workflow.objects.filter(pk=handle.id, status="completed").exists(), "its end")
        assert handle.result(timeout=5) == [1, 2]
    finally:
        engine.shutdown()


def test_a_malformed_carried_signal_makes_the_engine_read_every_mailbox() -> None:
    engine = Engine("carried-3", concurrency=1)
    engine._on_notify("S:not json")
    assert engine.wake.take()[2] is True  # rescan: nothing carried is trusted


@pytest.mark.postgres  # a row lock defers the commit
def test_a_consumed_signal_whose_commit_is_deferred_is_not_given_to_the_next_wait() -> None:
    """The pass that consumes the signal arms the next wait on the same name; its commit is deferred
    (the claim row is locked by a user's transaction), so the next pass's mailbox read still sees the
    signal buffered. It must not settle the second wait too (at 2058580 and before it did: [1, 1])."""
    from .test_commit_locks import holding

    handle = weft.start(carried_twice, id="carried-deferred")
    engine = Engine("carried-4", concurrency=2)
    engine.start()
    try:
        _parked(engine, handle.id, 1)
        with holding("SELECT 1 FROM weft_django_workflowclaim WHERE workflow_id = %s FOR UPDATE", [handle.id]):
            handle.signal("go", 1)
            tick_until(engine, lambda: handle.id in engine._carried, "the consuming commit deferred")
            for _ in range(5):  # the second wait's mailbox read, the signal still buffered there
                engine.tick()
        tick_until(
            engine,
            lambda: Step.objects.filter(workflow_id=handle.id, kind="signal").exists(),
            "the consumption durable",
        )
        for _ in range(3):
            engine.tick()
        assert Step.objects.filter(workflow_id=handle.id, kind="signal").count() == 1, "a signal consumed twice"
        assert Workflow.objects.get(pk=handle.id).status == "running"
        handle.signal("go", 2)
        tick_until(engine, lambda: Workflow.objects.filter(pk=handle.id, status="completed").exists(), "its end")
        assert handle.result(timeout=5) == [1, 2]
    finally:
        engine.shutdown()


def test_the_signals_a_context_took_are_forgotten_once_durable() -> None:
    """signals_taken holds only what a later read or a late S: could hand out again: not every signal
    a long-lived workflow ever consumed (without a read's top signal id, e.g. on SQLite, too)."""
    handle = weft.start(carried_loop, id="carried-loop")
    engine = Engine("carried-6", concurrency=2)
    engine.start()
    try:
        for n in range(1, 6):
            _parked(engine, handle.id, n)
            handle.signal("go", n)
        _parked(engine, handle.id, 6)
        assert len(engine.owned[handle.id].signals_taken) <= 1
        assert BufferedSignal.objects.filter(workflow_id=handle.id, state="consumed").count() == 5
    finally:
        engine.shutdown()
