"""A signal's wake-up carries its row (``S:``, store/notify.py), and the engine holding the parked
workflow consumes it without reading the mailbox, but only when it can tell the row is still
buffered (engine/signal_delivery.py). A stale ``S:`` (a signal consumed already, by this context or
before it was loaded) must never be consumed a second time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.utils import timezone

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


@weft.workflow(name="tests.carried_after_sleep")
def carried_after_sleep(ctx: Any) -> Any:
    yield ctx.sleep("1s")
    return (yield ctx.wait_for_signal("go"))


@weft.workflow(name="tests.carried_twice")
def carried_twice(ctx: Any) -> Any:
    first = yield ctx.wait_for_signal("go")
    second = yield ctx.wait_for_signal("go")
    return [first, second]


class _Reads:
    """Counts the engine's mailbox reads: ``count`` of signals, ``updates`` of admitted updates (the
    real reads run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts = {"signals": 0, "updates": 0}
        self._wrap(monkeypatch, signal_delivery.histories, "buffered_signals", "signals")
        self._wrap(monkeypatch, messages.mailbox, "admitted_updates", "updates")

    def _wrap(self, monkeypatch: pytest.MonkeyPatch, module: Any, name: str, key: str) -> None:
        real = getattr(module, name)

        def counted(workflow_ids: list[str], using: str) -> Any:
            self.counts[key] += 1
            return real(workflow_ids, using)

        monkeypatch.setattr(module, name, counted)

    @property
    def count(self) -> int:
        return self.counts["signals"]

    @property
    def updates(self) -> int:
        return self.counts["updates"]


@contextmanager
def _parked_at_first_wait(workflow: Any, workflow_id: str, engine_id: str) -> Iterator[tuple[Engine, Any]]:
    """An in-process engine holding the started workflow, parked at its first wait (shut down after)."""
    handle = weft.start(workflow, id=workflow_id)
    engine = Engine(engine_id, concurrency=2)
    engine.start()
    try:
        _parked(engine, handle.id, 1)
        yield engine, handle
    finally:
        engine.shutdown()


def _parked(engine: Engine, workflow_id: str, waits: int) -> None:
    """Tick until the workflow waits on its ``waits``-th signal and that wait's mailbox read is done."""

    def parked() -> bool:
        owned = engine.owned.get(workflow_id)
        return owned is not None and (owned.signal_top is not None or _on_sqlite(engine))  # SQLite: no top

    tick_until(engine, parked, "the workflow parked")
    tick_until(engine, lambda: _signal_steps(workflow_id) == waits - 1, "the earlier signals consumed")
    for _ in range(3):
        engine.tick()


def _on_sqlite(engine: Engine) -> bool:
    return connections[engine.using].vendor == "sqlite"


def _finish(engine: Engine, handle: Any, expected: Any) -> None:
    """Send the last signal and tick until the workflow returns ``expected``."""
    handle.signal("go", expected[-1])
    tick_until(engine, lambda: Workflow.objects.filter(pk=handle.id, status="completed").exists(), "its end")
    assert handle.result(timeout=5) == expected


def _signal_steps(workflow_id: str) -> int:
    return Step.objects.filter(workflow_id=workflow_id, kind="signal").count()


def _stale_wake_up(signal: BufferedSignal) -> str:
    """The S: wake-up its sender's statement sent (the same row, as PostgreSQL's json_build_array renders it)."""
    row = [signal.pk, signal.workflow_id, str(signal.run_id), signal.name, signal.payload, signal.trace_context]
    return "S:" + json.dumps(row)


@pytest.mark.postgres  # the S: wake-up comes from LISTEN
def test_a_parked_workflow_takes_the_carried_signal_without_reading_its_mailbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _parked_at_first_wait(carried_once, "carried-once", "carried-1") as (engine, handle):
        reads = _Reads(monkeypatch)
        handle.signal("go", "fast")
        tick_until(engine, lambda: Workflow.objects.filter(pk=handle.id, status="completed").exists(), "its end")
        assert handle.result(timeout=5) == "fast"
        assert reads.count == 0, "the engine read the mailbox for a signal its wake-up carried"
        assert BufferedSignal.objects.get(workflow_id=handle.id).state == "consumed"


@pytest.mark.postgres
def test_a_carried_signal_reads_neither_the_mailbox_nor_the_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Updates come with their own w: wake-ups: a workflow that only a signal's S: named, still open
    after it (asleep here), has no admitted update to look for."""
    with _parked_at_first_wait(carried_then_sleep, "carried-sleep", "carried-5") as (engine, handle):
        reads = _Reads(monkeypatch)
        handle.signal("go", "v")
        tick_until(engine, lambda: _signal_steps(handle.id) == 1, "the signal consumed")
        for _ in range(3):
            engine.tick()
        assert (reads.count, reads.updates) == (0, 0)


def test_a_stale_carried_signal_is_never_consumed_twice() -> None:
    with _parked_at_first_wait(carried_twice, "carried-twice", "carried-2") as (engine, handle):
        handle.signal("go", 1)
        _parked(engine, handle.id, 2)  # the first consumed; the second wait's mailbox read done
        first = BufferedSignal.objects.get(workflow_id=handle.id)
        assert first.state == "consumed"
        stale = _stale_wake_up(first)

        def consumed_once() -> None:
            for _ in range(3):
                engine.tick()
            assert _signal_steps(handle.id) == 1, "a signal consumed twice"
            assert Workflow.objects.get(pk=handle.id).status == "running"

        engine._on_notify(stale)  # late, to the context that consumed it
        consumed_once()
        engine.reload_all()  # a new context (as after an eviction or a takeover) ...
        _parked(engine, handle.id, 2)
        engine._on_notify(stale)  # ... then the same late wake-up
        consumed_once()
        _finish(engine, handle, [1, 2])


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

    with _parked_at_first_wait(carried_twice, "carried-deferred", "carried-4") as (engine, handle):
        with holding("SELECT 1 FROM weft_django_workflowclaim WHERE workflow_id = %s FOR UPDATE", [handle.id]):
            handle.signal("go", 1)
            tick_until(engine, lambda: handle.id in engine._carried, "the consuming commit deferred")
            for _ in range(5):  # the second wait's mailbox read, the signal still buffered there
                engine.tick()
        tick_until(engine, lambda: _signal_steps(handle.id) == 1, "the consumption durable")
        for _ in range(3):
            engine.tick()
        assert _signal_steps(handle.id) == 1, "a signal consumed twice"
        assert Workflow.objects.get(pk=handle.id).status == "running"
        _finish(engine, handle, [1, 2])


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


# -- the known mailbox: read once, kept current by S: wake-ups ------------------------------------


@pytest.mark.postgres  # the load reads the mailbox with its top signal id; S: wake-ups come from LISTEN
@override_settings(WEFT={"POLL_INTERVAL": "60s"})  # no sweep (it reads every mailbox) during the test
def test_a_workflow_looping_on_a_signal_does_not_read_its_mailbox_for_each_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its load read the mailbox; each signal after that arrives carried, and each new wait on it is
    served from the mailbox the context knows: no read per wait, for signals or updates."""
    handle = weft.start(carried_loop, id="carried-known")
    engine = Engine("carried-7", concurrency=2)
    engine.start()
    try:
        _parked(engine, handle.id, 1)
        reads = _Reads(monkeypatch)
        for n in range(1, 6):
            handle.signal("go", n)
            _parked(engine, handle.id, n + 1)
        assert (reads.count, reads.updates) == (0, 0), "a mailbox read per wait"
        assert BufferedSignal.objects.filter(workflow_id=handle.id, state="consumed").count() == 5
    finally:
        engine.shutdown()


@pytest.mark.postgres
@override_settings(WEFT={"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1})
def test_an_evicted_workflow_recalled_by_a_signal_reads_only_its_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal's wake-up names a workflow the engine holds without its generator: it is loaded
    again (the load reads its signals and admitted updates too) and takes the signal without a
    separate read of either."""
    for i in range(3):
        weft.start(carried_once, id=f"carried-evicted-{i}")
    engine = Engine("carried-8", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: len(engine.owned) + len(engine.residency.evicted) == 3, "all three held")
        tick_until(engine, lambda: len(engine.residency.evicted) == 2, "two evicted")
        for _ in range(5):  # wake-ups of the starts, late: settled
            engine.tick()
        evicted, recalls = sorted(engine.residency.evicted)[0], engine.residency.recalls
        reads = _Reads(monkeypatch)
        weft.get_handle(evicted).signal("go", "back")
        tick_until(engine, lambda: Workflow.objects.filter(pk=evicted, status="completed").exists(), "its end")
        assert weft.get_handle(evicted).result(timeout=5) == "back"
        assert engine.residency.recalls == recalls + 1
        assert (reads.count, reads.updates) == (0, 0), "a mailbox read besides the load"
    finally:
        engine.shutdown()


@pytest.mark.postgres
@override_settings(WEFT={"POLL_INTERVAL": "60s"})  # no sweep: it would find the signal anyway
def test_a_carried_signal_at_or_below_the_top_makes_the_engine_read_the_mailbox() -> None:
    """A signal whose id was drawn before the context's read but whose transaction committed after
    it was not in that read and is not above its top: the known mailbox cannot tell whether it is
    still buffered, so the engine reads the mailbox, and the signal is taken (not left for the sweep)."""
    with _parked_at_first_wait(carried_once, "carried-late", "carried-9") as (engine, handle):
        workflow = Workflow.objects.get(pk=handle.id)
        late = BufferedSignal.objects.create(  # an id below every other: as if drawn long ago
            id=-1,
            workflow_id=handle.id,
            run_id=workflow.run_id,
            name="go",
            payload='"late"',
            state="buffered",
            created_at=timezone.now(),
        )
        engine._on_notify(_stale_wake_up(late))
        tick_until(engine, lambda: Workflow.objects.filter(pk=handle.id, status="completed").exists(), "its end")
        assert handle.result(timeout=5) == "late"


@pytest.mark.postgres
@override_settings(WEFT={"POLL_INTERVAL": "60s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "60s", "WORKFLOW_CLAIM_TTL": "180s"})
def test_a_signal_named_by_w_before_its_wait_is_armed_is_read_when_the_wait_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal too big to carry sends w:. It arrives while the workflow sleeps (no wait for it yet):
    the known mailbox must not stand for a read when the wait is armed, or the signal waits for the
    sweep (a minute here). Review of 824c4e2: before the fix it timed out."""
    from weft_django.store import notify

    handle = weft.start(carried_after_sleep, id="carried-big-early")
    engine = Engine("carried-10", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned, "the workflow held")
        big = "x" * notify.MAX_CARRIED_SIGNAL
        handle.signal("go", big)
        for _ in range(5):  # the w: served while it sleeps
            engine.tick()
        assert _signal_steps(handle.id) == 0
        tick_until(
            engine, lambda: Workflow.objects.filter(pk=handle.id, status="completed").exists(), "its end", timeout=15
        )
        assert handle.result(timeout=5) == big
    finally:
        engine.shutdown()
