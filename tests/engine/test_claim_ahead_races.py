"""WEFT["CLAIM_AHEAD"] (engine/ahead.py) under interleavings forced by a review (session 26's
``aheadreview`` helper), each seen failing before its fix:

- the pass after a claim ahead still acquires what a wake-up names (the claim ahead stands for the
  next pass's full-batch rescan only), not a POLL_INTERVAL later;
- a workflow of the commit in flight claimed again beside it is not forgotten when the commit's result
  handling raises a database error (its new claim would be held by this engine and driven by nobody
  until it lapsed);
- an attempt the commit recorded is not dispatched for a workflow a peer took over while the claim
  ahead's code ran (a stall, engine/stall.py): its new owner runs it;
- the claims the claim ahead took are not forgotten when the database clock read after the acquire
  fails (held by this engine, driven by nobody until they lapsed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import OperationalError
from django.test import override_settings

import weft_django as weft
from tests.engine.test_claim_ahead import AHEAD, BATCH, SEEN_DURABLE, _drain, _each_step_once, _engine, _start_backlog
from tests.testapp.workflows import local_steps
from weft_django.engine import ahead
from weft_django.models import Workflow, WorkflowClaim
from weft_django.store import runs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@override_settings(WEFT=AHEAD)
def test_the_pass_after_a_claim_ahead_acquires_what_a_wake_up_names() -> None:
    """A claim ahead took the backlog's last, partial batch. A run started then sends its wake-up:
    the next pass acquires it at once, not a POLL_INTERVAL (10 s here) later."""
    ids = _start_backlog("car-wake", BATCH + 2)  # a full batch, then two: the claim ahead's is partial
    engine = _engine("car-wake")
    try:
        for _ in range(20):
            engine.tick()
            if engine.claimed_ahead:
                break
        assert engine.claimed_ahead == 2, "the commit of the first batch ran no claim ahead"
        late = weft.start(local_steps, args=["car-wake-late", 1], id="car-wake-late").id
        deadline = time.monotonic() + 5
        while not engine.wake.pending(late) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.wake.pending(late), "the start's wake-up never arrived"
        began = time.monotonic()
        _drain(engine, [*ids, late], passes=100)
        assert time.monotonic() - began < 5, "the woken run waited for the maintenance scan"
    finally:
        engine.shutdown()
    _each_step_once(ids, 3)
    assert Workflow.objects.get(pk=late).status == "completed"


@override_settings(WEFT=AHEAD)
def test_a_workflow_claimed_again_beside_the_commit_is_not_forgotten_when_the_result_handling_fails(
    monkeypatch: Any,
) -> None:
    """The first batch's commit is in flight; a transition releases one of its claims and the claim
    ahead takes it at a new epoch (the commit then refuses its writes: lost). Handling that loss reads
    the database, which fails once (a connection cut): the pass's containment reloads every workflow.
    The one claimed again must be loaded at its new epoch, not looked for at its old one and forgotten
    while this engine holds its claim."""
    ids = _start_backlog("car-clash-db", 3 * BATCH)
    target = ids[0]
    released, acquired = threading.Event(), threading.Event()
    claim_ahead = ahead.claim_ahead

    def claim_after_release(engine: Any, inflight: set[str], clash: dict[str, int], failed: list[Exception]) -> None:
        if target in inflight:
            assert released.wait(10)
        claimer_claim_ahead = engine.claimer.claim_ahead

        def noted() -> Any:
            try:
                return claimer_claim_ahead()
            finally:
                acquired.set()

        engine.claimer.claim_ahead = noted
        try:
            claim_ahead(engine, inflight, clash, failed)
        finally:
            engine.claimer.claim_ahead = claimer_claim_ahead

    monkeypatch.setattr(ahead, "claim_ahead", claim_after_release)
    engine = _engine("car-clash-db")
    run = engine.commits.run

    def release_then_commit(job: Callable[[], Any], beside: Callable[[], None]) -> Any:
        def released_first() -> Any:  # on the commit thread: the release, then the fence after the acquire
            if not released.is_set():
                old = datetime(2000, 1, 1, tzinfo=UTC)  # the acquire takes the oldest run first
                WorkflowClaim.objects.filter(pk=target).update(engine_id=None, expires_at=None, run_created_at=old)
                released.set()
                assert acquired.wait(10)
            return job()

        return run(released_first, beside)

    monkeypatch.setattr(engine.commits, "run", release_then_commit)
    cancelled_among = runs.cancelled_among
    cut: list[list[str]] = []

    def cut_once(workflow_ids: list[str], using: str) -> set[str]:
        if target in workflow_ids and not cut:
            cut.append(list(workflow_ids))
            raise OperationalError("server closed the connection unexpectedly")
        return cancelled_among(workflow_ids, using)

    monkeypatch.setattr(runs, "cancelled_among", cut_once)
    try:
        for _ in range(50):
            engine.tick()
            if cut:
                break
        assert cut, "the commit in flight never lost the workflow claimed again beside it"
        holder, epoch = WorkflowClaim.objects.filter(pk=target).values_list("engine_id", "epoch").get()
        assert holder == engine.engine_id
        context = engine.owned.get(target)
        known = engine._reload.get(target) if context is None else context.epoch
        assert known == epoch, f"claim held at epoch {epoch}, the engine knows it at {known}: driven by nobody"
        _drain(engine, ids)
    finally:
        engine.shutdown()
    _each_step_once(ids, 3)


@override_settings(WEFT=AHEAD)
def test_an_attempt_of_a_workflow_taken_over_while_the_claim_ahead_ran_is_not_dispatched(monkeypatch: Any) -> None:
    """The first batch's commit records each run's regular attempt; beside it the claim ahead runs the
    next batch's code, which stalls (engine/stall.py): renewal lets the other claims lapse, a peer takes
    one over and renewal reports it lost (``Wake.report_lost``). Once the claim ahead returns, the pass
    must not dispatch that workflow's attempt: its new owner runs it (the lost context would run it a
    second time, beside the owner's)."""
    ids = _start_backlog("car-taken", 3 * BATCH, regular=True)
    target = ids[0]
    committed = threading.Event()
    taken: list[int] = []
    claim_ahead = ahead.claim_ahead

    def taken_over_meanwhile(engine: Any, inflight: set[str], clash: dict[str, int], failed: list[Exception]) -> None:
        if target in inflight and not taken:
            assert committed.wait(10)  # the commit recording the attempt landed; then the stall, the takeover
            epoch = engine.owned[target].epoch
            WorkflowClaim.objects.filter(pk=target).update(engine_id="car-taken-peer", epoch=epoch + 1000)
            engine.wake.report_lost({target: epoch})
            taken.append(epoch)
        claim_ahead(engine, inflight, clash, failed)

    monkeypatch.setattr(ahead, "claim_ahead", taken_over_meanwhile)
    engine = _engine("car-taken")
    run = engine.commits.run

    def noted(job: Callable[[], Any], beside: Callable[[], None]) -> Any:
        def commit() -> Any:
            try:
                return job()
            finally:
                committed.set()

        return run(commit, beside)

    monkeypatch.setattr(engine.commits, "run", noted)
    try:
        for _ in range(50):
            engine.tick()
            if taken:
                break
        assert taken, "the claim ahead never ran beside the commit of the target's attempt"
        context = engine.owned.get(target)
        assert context is None or not context.inflight, "the attempt of a workflow taken over was dispatched"
        assert target not in engine.attention.running
    finally:
        engine.shutdown()
    assert target not in [wid for wid, _ in SEEN_DURABLE], "the lost context ran the new owner's attempt"


@override_settings(WEFT=AHEAD)
def test_claims_taken_ahead_are_not_forgotten_when_the_clock_read_after_the_acquire_fails(
    monkeypatch: Any,
) -> None:
    """The claim ahead acquires the next batch, then reads the database clock for their load, which
    fails once (a connection cut): the claims it took are this engine's and must be loaded by a later
    pass, not held and driven by nobody until they lapse."""
    ids = _start_backlog("car-clock", 3 * BATCH)
    inside: list[bool] = []
    cut: list[bool] = []
    claim_ahead = ahead.claim_ahead

    def noted(engine: Any, inflight: set[str], clash: dict[str, int], failed: list[Exception]) -> None:
        inside.append(True)
        try:
            claim_ahead(engine, inflight, clash, failed)
        finally:
            inside.clear()

    monkeypatch.setattr(ahead, "claim_ahead", noted)
    engine = _engine("car-clock")
    now = engine.clock.now

    def cut_once(*, fresh: bool, reuse: float) -> datetime:
        if inside and not cut:
            cut.append(True)
            raise OperationalError("server closed the connection unexpectedly")
        return now(fresh=fresh, reuse=reuse)

    monkeypatch.setattr(engine.clock, "now", cut_once)
    try:
        for _ in range(50):
            engine.tick()
            if cut:
                break
        assert cut, "no claim ahead read the clock"
        held = dict(WorkflowClaim.objects.filter(engine_id=engine.engine_id).values_list("pk", "epoch"))
        known = {**engine._reload, **{wid: owned.epoch for wid, owned in engine.owned.items()}}
        forgotten = {wid: epoch for wid, epoch in held.items() if known.get(wid) != epoch}
        assert not forgotten, f"claims held by the engine, driven by nobody: {forgotten}"
        _drain(engine, ids)
    finally:
        engine.shutdown()
    _each_step_once(ids, 3)
