"""WEFT["CLAIM_AHEAD"] (engine/ahead.py, engine/committer.py): while a backlog waits, a pass's fenced
commit runs on its own thread and connection and the loop claims, loads and runs the next batch beside
it. These tests drive an in-process engine over a backlog on PostgreSQL (SQLite has one writer: there
the commit stays on the loop, checked too) and check the rules the overlap must keep: every workflow
ends once with each step recorded once, an attempt is dispatched only after its attempt record is
durable, the commit's result is handled before anything the claim ahead raised, a workflow of the
commit in flight claimed again beside it is loaded after the commit, the commit thread's connection
lost is a refused commit like any other, and shutdown closes that connection."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

import weft_django as weft
from tests.testapp.workflows import local_steps
from weft_django import signals
from weft_django.engine import ahead, cascade
from weft_django.engine.engine import Engine
from weft_django.models import Step, Workflow, WorkflowClaim
from weft_django.store.backend import backend

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = 5
AHEAD = {"CLAIM_BATCH_SIZE": BATCH, "POLL_INTERVAL": "10s"}
SEEN_DURABLE: list[tuple[str, bool]] = []


@weft.activity
def ca_check_recorded(workflow_id: str) -> str:
    """Runs on an activity thread (its own connection: it sees committed rows only): was this attempt's
    record durable when it was dispatched?"""
    durable = Step.objects.filter(workflow_id=workflow_id, seq=1, status="running").exists()
    SEEN_DURABLE.append((workflow_id, durable))
    return workflow_id


@weft.workflow(name="tests.ca_local_then_regular")
def local_then_regular(ctx: Any, workflow_id: str) -> Any:
    first = yield ctx.run(local_steps_step, workflow_id)
    second = yield ctx.run(ca_check_recorded, workflow_id)
    return [first, second]


@weft.activity(local=True)
def local_steps_step(key: str) -> str:
    return f"local-{key}"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    SEEN_DURABLE.clear()
    yield


def _start_backlog(prefix: str, n: int, regular: bool = False) -> list[str]:
    ids = [f"{prefix}-{i:03d}" for i in range(n)]
    if regular:
        requests = [weft.StartRequest(local_then_regular, args=[wid], id=wid) for wid in ids]
    else:
        requests = [weft.StartRequest(local_steps, args=[wid, 3], id=wid) for wid in ids]
    weft.start_many(requests)
    return ids


def _drain(engine: Engine, ids: list[str], passes: int = 2000) -> None:
    """Tick as Engine.run does until every run of ``ids`` ended."""
    for _ in range(passes):
        if not engine.tick():
            engine._wait(0.01)
        if not Workflow.objects.filter(id__in=ids, status="running").exists():
            return
    left = list(Workflow.objects.filter(id__in=ids, status="running").values_list("id", flat=True))
    raise AssertionError(f"still running after {passes} passes: {left}")


def _each_step_once(ids: list[str], steps: int) -> None:
    rows = list(Step.objects.filter(workflow_id__in=ids).values_list("workflow_id", "seq"))
    assert len(rows) == len(set(rows)) == len(ids) * steps
    assert set(Workflow.objects.filter(id__in=ids).values_list("status", flat=True)) == {"completed"}


def _engine(name: str) -> Engine:
    engine = Engine(name, concurrency=4)
    engine.start()
    return engine


def _drained(prefix: str, n: int, steps: int = 3, regular: bool = False) -> Engine:
    """Start a backlog of ``n`` runs, drain it with an engine (shut down after), check each step once."""
    ids = _start_backlog(prefix, n, regular=regular)
    engine = _engine(prefix)
    try:
        _drain(engine, ids)
    finally:
        engine.shutdown()
    _each_step_once(ids, steps)
    return engine


@pytest.mark.postgres
@override_settings(WEFT=AHEAD)
def test_a_backlog_drains_with_commits_beside_the_next_claim_each_step_once() -> None:
    engine = _drained("ca-local", 7 * BATCH + 2)
    assert engine.commits.overlapped >= 5, "no commit ran beside a claim ahead"


@pytest.mark.postgres
@override_settings(WEFT=AHEAD)
def test_an_attempt_claimed_ahead_is_dispatched_only_after_its_record_is_durable() -> None:
    engine = _drained("ca-regular", 6 * BATCH, steps=2, regular=True)
    assert engine.commits.overlapped >= 3
    assert sorted(wid for wid, _ in SEEN_DURABLE) == [f"ca-regular-{i:03d}" for i in range(6 * BATCH)]
    assert [wid for wid, durable in SEEN_DURABLE if not durable] == [], "dispatched before its record committed"


@override_settings(WEFT={**AHEAD, "CLAIM_AHEAD": False})
def test_claim_ahead_off_commits_on_the_loop() -> None:
    engine = _drained("ca-off", 3 * BATCH + 1)
    assert engine.commits.overlapped == 0


@override_settings(WEFT=AHEAD)
def test_where_the_database_has_one_writer_the_commit_stays_on_the_loop() -> None:
    engine = _drained("ca-one-writer", 3 * BATCH + 1)
    assert (engine.commits.overlapped > 0) == backend("default").concurrent_writers


@pytest.mark.postgres
@override_settings(WEFT=AHEAD)
def test_the_commits_result_is_handled_before_what_the_claim_ahead_raised(monkeypatch) -> None:
    """The claim ahead fails once (a bug in the loop, say): the runs the commit beside it ended are
    still signalled (their result handled), then the pass's containment reloads the rest."""
    ids = _start_backlog("ca-raises", 4 * BATCH)
    completed: list[str] = []

    def heard(sender: Any, workflow_id: str, **kwargs: Any) -> None:
        completed.append(workflow_id)

    settle_new = cascade.settle_new
    raised: list[int] = []

    def failing_once(*args: Any, **kwargs: Any) -> bool:
        if not raised:
            raised.append(len(completed))
            raise RuntimeError("the claim ahead broke")
        return settle_new(*args, **kwargs)

    monkeypatch.setattr(cascade, "settle_new", failing_once)
    signals.workflow_completed.connect(heard, weak=False)
    engine = _engine("ca-raises")
    try:
        _drain(engine, ids)
    finally:
        engine.shutdown()
        signals.workflow_completed.disconnect(heard)
    _each_step_once(ids, 3)
    assert raised, "the claim ahead never ran"
    assert sorted(completed) == ids, "a run the commit beside the failed claim ahead ended was never signalled"


@pytest.mark.postgres
@override_settings(WEFT=AHEAD)
def test_a_workflow_of_the_commit_in_flight_claimed_again_beside_it_is_loaded_after_it(monkeypatch) -> None:
    """While the first overlapped commit is in flight, a transition releases one of its claims (as a
    suspend-and-resume does) and the claim ahead takes it at a new epoch: the commit refuses its writes,
    the old context is dropped, and the next pass loads it at the new epoch; it ends once, each step
    recorded once.

    The target is taken from the commit in flight (the acquire orders by creation time only, and
    start_many gives the backlog one: which runs the first batch holds is the database's choice)."""
    ids = _start_backlog("ca-clash", 3 * BATCH)
    chosen, released = threading.Event(), threading.Event()
    target: list[str] = []
    clashes: list[dict[str, int]] = []
    claim_ahead = ahead.claim_ahead

    def claim_after_release(engine: Any, inflight: set[str], clash: dict[str, int], failed: list[Exception]) -> None:
        if not chosen.is_set():  # the first overlapped commit: one of its workflows is released
            target.append(min(inflight))
            chosen.set()
            assert released.wait(10)
        claim_ahead(engine, inflight, clash, failed)
        if clash:
            clashes.append(dict(clash))

    monkeypatch.setattr(ahead, "claim_ahead", claim_after_release)
    engine = _engine("ca-clash")
    run = engine.commits.run

    def release_then_commit(job: Callable[[], Any], beside: Callable[[], None]) -> Any:
        def released_first() -> Any:  # on the commit thread, before the fenced commit
            if not released.is_set():
                assert chosen.wait(10)
                old = datetime(2000, 1, 1, tzinfo=UTC)  # the acquire takes the oldest run first
                WorkflowClaim.objects.filter(pk=target[0]).update(engine_id=None, expires_at=None, run_created_at=old)
                released.set()
            return job()

        return run(released_first, beside)

    monkeypatch.setattr(engine.commits, "run", release_then_commit)
    try:
        _drain(engine, ids)
    finally:
        engine.shutdown()
    assert clashes and target[0] in clashes[0], f"the claim ahead did not take {target} again: {clashes}"
    _each_step_once(ids, 3)


@pytest.mark.postgres
@override_settings(WEFT=AHEAD)
def test_the_commit_threads_connection_lost_is_a_refused_commit_and_the_next_reconnects() -> None:
    ids = _start_backlog("ca-lost", 6 * BATCH)
    engine = _engine("ca-lost")
    pids: list[int] = []
    try:
        for _ in range(200):  # until a commit ran beside a claim ahead: the thread has its connection
            engine.tick()
            if engine.commits.overlapped:
                break
        pid = engine.commits.run(lambda: connections["default"].connection.info.backend_pid, lambda: None)
        pids.append(pid)
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        _drain(engine, ids)
        pids.append(engine.commits.run(lambda: connections["default"].connection.info.backend_pid, lambda: None))
    finally:
        engine.shutdown()
    _each_step_once(ids, 3)
    assert pids[0] != pids[1], "the commit thread kept its lost connection"
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pids[1]])
        assert cursor.fetchone()[0] == 0, "shutdown left the commit thread's connection open"
