"""Evicted workflows (``MAX_RESIDENT_WORKFLOWS``, engine/residency.py) under interleavings that must
leave them correct (each passed when written; kept as regression tests):

- a signal, a query and an update reach an evicted workflow before the engine's next pass: one recall
  serves all three, each exactly once;
- a workflow whose commit was deferred (a user's transaction holds a row it writes) is not evicted
  while its writes are carried: they land once the row is free, and its run goes on from them;
- a cancelled evicted workflow is not recalled: its claim moved on, nothing of it is loaded or written.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

import weft_django as weft
from tests.engine.test_commit_locks import holding
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.models import BufferedSignal, PendingUpdate, QueryRequest, Step, WorkflowClaim

pytestmark = pytest.mark.django_db(transaction=True)
ONE_RESIDENT = {"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1}


@weft.workflow(name="tests.ei_counter")
def counter(ctx: Any) -> Any:
    state = {"n": 0, "got": None}
    ctx.on_query("state", lambda: dict(state))

    def bump(k: int) -> int:
        state["n"] += k
        return state["n"]

    ctx.on_update("bump", bump)
    state["got"] = yield ctx.wait_for_signal("go")
    more = yield ctx.wait_for_signal("more")
    return [state["got"], state["n"], more]


def _evicted(engine: Engine, prefix: str) -> str:
    for n in range(3):
        weft.start(counter, id=f"{prefix}-{n}")
    tick_until(engine, lambda: len(engine.residency.evicted) == 2 and not engine._reload, "two evicted")
    return sorted(engine.residency.evicted)[0]


def _closing(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call`` on a pool thread, whose own connection is closed after it (the test database is dropped)."""
    try:
        return call(*args, **kwargs)
    finally:
        connections.close_all()


def _wait_for(predicate: Any, message: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        time.sleep(0.01)


@pytest.mark.postgres  # their wake-ups recall it (on SQLite the sweep does, once per renew interval)
@override_settings(WEFT=ONE_RESIDENT)
def test_a_signal_a_query_and_an_update_for_an_evicted_workflow_are_each_served_once() -> None:
    engine = Engine("ei-all", concurrency=2)
    engine.start()
    try:
        wid = _evicted(engine, "ei-all")
        handle = weft.get_handle(wid)
        before = engine.residency.recalls
        with ThreadPoolExecutor(2) as pool:
            handle.signal("go", "sig")
            update = pool.submit(_closing, handle.update, "bump", 5, timeout="20s")
            query = pool.submit(_closing, handle.query, "state", timeout="20s")
            _wait_for(
                lambda: (
                    PendingUpdate.objects.filter(workflow_id=wid).exists()
                    and QueryRequest.objects.filter(workflow_id=wid).exists()
                ),
                "the update and the query written",
            )
            assert wid in engine.residency.evicted  # all three wait for the engine's next pass
            tick_until(engine, lambda: update.done() and query.done(), "the update and the query answered")
            assert update.result() == 5
            assert query.result()["got"] == "sig"
        assert BufferedSignal.objects.get(workflow_id=wid).state == "consumed"
        handle.signal("more", "two")
        tick_until(engine, lambda: handle.describe()["status"] == "completed", "its end")
        assert handle.result(timeout=1) == ["sig", 5, "two"]
        assert engine.residency.recalls - before <= 2 and engine.refused_commits == 0
    finally:
        engine.shutdown()


@pytest.mark.postgres
@override_settings(WEFT=ONE_RESIDENT)
def test_a_workflow_whose_commit_is_carried_is_not_evicted() -> None:
    engine = Engine("ei-carry", concurrency=2)
    engine.start()
    try:
        other = _evicted(engine, "ei-carry")
        [resident] = engine.owned
        weft.signal(resident, "go", "held")
        pk = BufferedSignal.objects.get(workflow_id=resident).pk
        sql = f"SELECT 1 FROM {BufferedSignal._meta.db_table} WHERE id = %s FOR UPDATE"
        with holding(sql, [pk], hold_at_most=20):  # its consumption must wait for the row
            tick_until(engine, lambda: resident in engine._carried, "its commit carried")
            weft.signal(other, "go", "recalled")  # another workflow loaded: the engine is over its limit
            consumed = BufferedSignal.objects.filter(workflow_id=other, state="consumed")
            tick_until(engine, consumed.exists, "the recalled workflow took its signal")
            tick_until(engine, lambda: engine.residency.evictions >= 3, "back to its limit")
            for _ in range(5):
                engine.tick()
            assert resident in engine.owned and resident not in engine.residency.evicted
            assert resident in engine._carried
        tick_until(engine, lambda: Step.objects.filter(workflow_id=resident, seq=0).exists(), "its carried commit")
        for wid, value in ((resident, "held"), (other, "recalled")):
            weft.signal(wid, "more", "end")
            handle = weft.get_handle(wid)
            tick_until(engine, lambda h=handle: h.describe()["status"] == "completed", "its end")
            assert handle.result(timeout=1) == [value, 0, "end"]
    finally:
        engine.shutdown()


@override_settings(WEFT=ONE_RESIDENT)
def test_a_cancelled_evicted_workflow_is_not_recalled() -> None:
    engine = Engine("ei-cancel", concurrency=2)
    engine.start()
    try:
        wid = _evicted(engine, "ei-cancel")
        epoch = engine.residency.evicted[wid]
        weft.get_handle(wid).cancel("stop")
        engine.wake.look_at(wid)  # its wake-up (SQLite has none)
        for _ in range(5):
            engine.tick()
        assert wid not in engine.owned and wid not in engine.residency.evicted and wid not in engine._reload
        claim = WorkflowClaim.objects.get(pk=wid)
        assert (claim.engine_id, claim.epoch > epoch) == (None, True)
        assert weft.get_handle(wid).describe()["status"] == "cancelled"
        assert engine.refused_commits == 0
    finally:
        engine.shutdown()
