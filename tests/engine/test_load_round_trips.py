"""Loading a freshly claimed batch (Engine._load, engine/progress.py ``load``): on PostgreSQL one
round trip per chunk of ids reads the runs, steps, applied updates, timers and admitted updates, and
the first mailbox look at a new context uses those admitted updates instead of querying again. The
loaded state is the one the separate ORM queries read."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.db import connections
from django.db.models import Max
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from tests.testapp.workflows import add
from weft_django.engine import loader as loader_module
from weft_django.engine.driver import AppliedRecord
from weft_django.engine.engine import Engine
from weft_django.engine.messages import _state as mailbox_state
from weft_django.engine.messages import deliver_messages
from weft_django.engine.wakeups import Listener
from weft_django.models import AppliedUpdate, BufferedSignal, PendingUpdate, Step, Timer, Workflow, WorkflowClaim
from weft_django.store import histories
from weft_django.store.clock import db_now
from weft_django.testing import running_engine, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

N = 3


@weft.workflow(name="tests.load_round_trips")
def counted(ctx: Any, key: str) -> Any:
    """Two activity steps, then a wait_until (a timer) fed by updates, then a last activity."""
    state: dict[str, Any] = {"total": 0, "seen": []}

    def add_amount(amount: int) -> int:
        state["total"] += amount
        state["seen"].append(amount)
        return state["total"]

    ctx.on_update("add", add_amount)
    ctx.expose(total=lambda: state["total"], seen=lambda: list(state["seen"]))
    first = yield ctx.run(add, 1, 2)
    second = yield ctx.run(add, first, 4)
    reached = yield ctx.wait_until(lambda: state["total"] >= 12, timeout="1h")
    last = yield ctx.run(add, second, state["total"])
    return {"key": key, "first": first, "second": second, "reached": reached, "last": last, "seen": state["seen"]}


def _parked_batch() -> list[str]:
    """N workflows parked at their wait_until (steps, a timer), each with one applied update ("add" 5)
    and one admitted update nobody has handled yet ("add" 7); the first has a buffered signal nobody
    waits for. No engine holds them."""
    ids = [f"load-rt-{i}" for i in range(N)]
    with running_engine("load-rt-first"):
        handles = [weft.start("tests.load_round_trips", args=[wid], id=wid) for wid in ids]
        wait_for(lambda: Timer.objects.filter(workflow_id__in=ids).count() == N, timeout=20, message="parked")
        for handle in handles:
            assert handle.update("add", 5, timeout="10s") == 5
    assert not WorkflowClaim.objects.filter(workflow_id__in=ids, engine_id__isnull=False).exists()
    for wid in ids:
        PendingUpdate.objects.create(
            workflow_id=wid, run_id=Workflow.objects.get(pk=wid).run_id, name="add", payload="7", created_at=db_now()
        )
    weft.get_handle(ids[0]).signal("aside", "nobody waits for it")  # a buffered signal the load reads too
    return ids


def _started(engine_id: str) -> Engine:
    """An engine whose listener is up (its first connection asks for one rescan: consumed by the
    first tick, so later ticks look only at what wake-ups name)."""
    engine = Engine(engine_id)
    engine.start()
    listener = next(thread for thread in engine._threads if isinstance(thread, Listener))
    assert listener.connected.wait(10)
    return engine


def _unfenced_update_reads(queries: list[dict[str, Any]]) -> list[str]:
    """SELECTs of admitted updates outside the fenced settlement (which takes them FOR UPDATE)."""
    return [
        q["sql"]
        for q in queries
        if q["sql"].lstrip().upper().startswith("SELECT")
        and "weft_django_pendingupdate" in q["sql"]
        and "FOR UPDATE" not in q["sql"]
    ]


def test_a_claimed_batch_is_taken_and_loaded_in_one_round_trip_and_runs_as_before(monkeypatch):
    ids = _parked_batch()
    loads: list[list[str]] = []
    real_load = loader_module.load

    def counting_load(workflow_ids: list[str], using: str) -> histories.Loaded:
        loads.append(list(workflow_ids))
        return real_load(workflow_ids, using)

    monkeypatch.setattr(loader_module, "load", counting_load)
    engine = _started("load-rt-second")
    try:
        with CaptureQueriesContext(connections[engine.using]) as captured:
            engine.tick()  # claims the batch and loads it
        assert loads == []  # nothing left to load after the claim statement (store/claims/taking.py)
        # The claim and the six reads are prepared once per connection (ADR 0012), then ONE round trip
        # runs them all: the claim statement and the whole batch's load.
        sent = [q["sql"] for q in captured.captured_queries]
        prepares = {q.split(" ", 2)[1]: q for q in sent if q.startswith("PREPARE ")}
        batches = [q for q in sent if "SET LOCAL enable_sort = off" in q]
        assert len(batches) == 1, sent
        called = [prepares[name] for name in re.findall(r"EXECUTE (weft_\w+)", batches[0])]
        assert len(called) == 7 and "UPDATE weft_django_workflowclaim" in called[0]
        for table, read in zip(
            ("workflow", "step", "appliedupdate", "timer", "bufferedsignal", "pendingupdate"), called[1:], strict=True
        ):
            assert f"FROM weft_django_{table}" in read
        assert sorted(engine.owned) == ids
        assert [row[3] for row in (engine.owned[ids[0]].signals_known or {}).values()] == ["aside"]  # its mailbox, read
        for wid in ids:
            owned = engine.owned[wid]
            assert owned.run.frontier is not None and owned.run.frontier.seq == 2  # replayed past both steps
            assert engine.answer_query(wid, "seen") == [5]  # the applied update, re-applied on replay
            (timer,) = owned.timers.values()  # the wait_until's timeout, as the row it was loaded from
            row = Timer.objects.get(workflow_id=wid)
            assert (timer.pk, timer.kind, timer.seq, timer.fire_at) == (row.pk, row.kind, row.seq, row.fire_at)

        with CaptureQueriesContext(connections[engine.using]) as captured:
            engine.tick()  # the first look at the new contexts: settles the admitted updates
        assert _unfenced_update_reads(captured.captured_queries) == []  # read with the load already
        assert set(PendingUpdate.objects.filter(workflow_id__in=ids).values_list("status", flat=True)) == {"completed"}
        for wid in ids:
            assert engine.answer_query(wid, "seen") == [5, 7]
        wait_for(
            lambda: (engine.tick() or True) and Workflow.objects.filter(pk__in=ids, status="completed").count() == N
        )
    finally:
        engine.shutdown()
    for wid in ids:
        assert weft.get_handle(wid).result(timeout=5) == {
            "key": wid,
            "first": 3,
            "second": 7,
            "reached": True,
            "last": 19,
            "seen": [5, 7],
        }
    assert list(AppliedUpdate.objects.filter(workflow_id=ids[0]).order_by("seq", "n").values_list("seq", "name")) == [
        (2, "add"),
        (2, "add"),
    ]


def _orm_state(ids: list[str]) -> dict[str, Any]:
    """What the engine read before the batch load, through the ORM."""
    runs = {w.id: w for w in Workflow.objects.filter(pk__in=ids)}
    run_ids = [w.run_id for w in runs.values()]
    steps: dict[str, dict[int, tuple[Any, ...]]] = {str(r): {} for r in run_ids}
    for s in Step.objects.filter(run_id__in=run_ids):
        steps[str(s.run_id)][s.seq] = (
            s.seq,
            s.kind,
            s.name,
            s.status,
            s.result,
            s.error,
            s.attempts,
            s.started_at,
            s.completed_at,
        )
    applied: dict[str, list[AppliedRecord]] = {}
    for run_id, seq, n, name, payload, result, error, update_id in (
        AppliedUpdate.objects.filter(run_id__in=run_ids)
        .order_by("seq", "n")
        .values_list("run_id", "seq", "n", "name", "payload", "result", "error", "update_id")
    ):
        record = AppliedRecord(seq, n, name, payload, result, error, str(update_id) if update_id else None)
        applied.setdefault(str(run_id), []).append(record)
    timers: dict[str, list[tuple[Any, ...]]] = {}
    for t in Timer.objects.filter(workflow_id__in=ids).order_by("pk"):
        timers.setdefault(t.workflow_id, []).append(_timer_fields(t))
    admitted: dict[str, list[tuple[str, str, str, str]]] = {}
    for pk, wid, run_id, name in (
        PendingUpdate.objects.filter(workflow_id__in=ids, status="admitted")
        .order_by("created_at", "id")
        .values_list("id", "workflow_id", "run_id", "name")
    ):
        admitted.setdefault(wid, []).append((str(pk), wid, str(run_id), name))
    signals = {wid: [] for wid in runs}
    for row in (
        BufferedSignal.objects.filter(workflow_id__in=ids, state="buffered")
        .order_by("id")
        .values_list("id", "workflow_id", "run_id", "name", "payload", "trace_context")
    ):
        signals[row[1]].append(row)
    top = BufferedSignal.objects.aggregate(top=Max("id"))["top"] or 0
    return {
        "runs": runs,
        "steps": steps,
        "applied": applied,
        "timers": timers,
        "admitted": admitted,
        "signals": {wid: (top, rows) for wid, rows in signals.items()},
    }


def _timer_fields(t: Timer) -> tuple[Any, ...]:
    return (t.pk, t.workflow_id, t.run_id, t.kind, t.seq, t.attempt, t.fire_at, t._state.adding, t._state.db)


def _step_fields(step: Any) -> tuple[Any, ...]:
    return (
        step.seq,
        step.kind,
        step.name,
        step.status,
        step.result,
        step.error,
        step.attempts,
        step.started_at,
        step.completed_at,
    )


def _assert_same_as_orm(loaded: histories.Loaded, orm: dict[str, Any], admitted: bool) -> None:
    assert set(loaded.runs) == set(orm["runs"])
    for wid, row in loaded.runs.items():
        w = orm["runs"][wid]
        assert row.run_id == str(w.run_id) and isinstance(row.run_id, str)
        assert row.parent_run_id == (str(w.parent_run_id) if w.parent_run_id else None)
        for name in ("workflow_type", "version", "status", "input", "started_at", "execution_deadline"):
            assert getattr(row, name) == getattr(w, name), name
        assert row.started_at is not None and row.started_at.tzinfo is not None
        assert (row.stuck_error, row.stuck_attempts, row.parent_id, row.parent_seq, row.depth) == (
            w.stuck_error,
            w.stuck_attempts,
            w.parent_id,
            w.parent_seq,
            w.depth,
        )
    assert {r: {seq: _step_fields(s) for seq, s in steps.items()} for r, steps in loaded.steps.items()} == orm["steps"]
    assert loaded.applied == orm["applied"]
    timers = {wid: sorted(_timer_fields(t) for t in ts) for wid, ts in loaded.timers.items()}
    assert timers == orm["timers"]
    if admitted:
        assert loaded.admitted is not None
        assert {wid: [tuple(row) for row in rows] for wid, rows in loaded.admitted.items()} == orm["admitted"]
        assert loaded.signals is not None  # with the highest signal id the read saw
        assert {wid: (m.top, [tuple(r) for r in m.rows]) for wid, m in loaded.signals.items()} == orm["signals"]
    else:
        assert loaded.admitted is None and loaded.signals is None


def test_the_batch_reads_what_the_separate_queries_read(monkeypatch):
    ids = _parked_batch()
    AppliedUpdate.objects.filter(workflow_id=ids[0]).update(error={"type": "Boom", "message": "x"})
    Workflow.objects.filter(pk=ids[1]).update(stuck_error={"type": "Stuck"}, stuck_attempts=2)
    Step.objects.filter(workflow_id=ids[2], seq=0).update(error={"exc": "E", "nested": [1, None]})
    missing = ["no-such-workflow"]
    orm = _orm_state(ids)
    assert all(orm[key] for key in ("steps", "applied", "timers", "admitted"))
    with CaptureQueriesContext(connections["default"]) as captured:
        batched = histories.load(ids + missing, "default")
    assert len(captured.captured_queries) == 1
    _assert_same_as_orm(batched, orm, admitted=True)

    monkeypatch.setattr(histories, "_client_binding", lambda cursor: False)  # e.g. server-side binding
    with CaptureQueriesContext(connections["default"]) as captured:
        separate = histories.load(ids + missing, "default")
    assert len(captured.captured_queries) == 4  # runs, steps, applied updates, timers
    _assert_same_as_orm(separate, orm, admitted=False)


def test_chunks_of_500_ids_one_round_trip_each():
    ids = _parked_batch()
    many = [f"absent-{i}" for i in range(600)] + ids
    orm = _orm_state(ids)
    with CaptureQueriesContext(connections["default"]) as captured:
        loaded = histories.load(many, "default")
    assert len(captured.captured_queries) == 2
    _assert_same_as_orm(loaded, orm, admitted=True)


def test_an_update_admitted_after_the_load_is_found_on_its_wake_up():
    """The first look uses the admitted updates read with the load; an update admitted after that
    read comes with a ``w:<id>`` wake-up, and a woken workflow is read again."""
    wid = "load-rt-late"
    weft.start("tests.load_round_trips", args=[wid], id=wid)
    engine = _started("load-rt-late-engine")
    try:
        wait_for(
            lambda: (engine.tick() or True) and engine.owned.get(wid) is not None and engine.owned[wid].timers,
            timeout=20,
            message="parked at the wait_until",
        )
        assert engine.answer_query(wid, "seen") == []
        # A reload (as after a dropped claim or a failed commit) reads the mailbox with the run.
        engine._reload[wid] = engine.owned[wid].epoch
        engine._drop(wid, reason=None)
        engine._claim(db_now(), {}, set(), force=False, scan=False)
        owned = engine.owned[wid]
        assert mailbox_state(engine).prefetched[wid] == (owned, [])

        late = PendingUpdate.objects.create(
            workflow_id=wid, run_id=uuid.UUID(owned.run_id), name="add", payload="12", created_at=db_now()
        )
        with CaptureQueriesContext(connections[engine.using]) as captured:
            deliver_messages(engine, set(), False, db_now(), {}, set())  # the first look: nothing was admitted
        assert _unfenced_update_reads(captured.captured_queries) == []
        assert wid not in mailbox_state(engine).prefetched  # consumed: any later look queries
        assert PendingUpdate.objects.get(pk=late.pk).status == "admitted"

        engine._on_notify(f"w:{wid}")  # what the admitting client's NOTIFY does through the listener
        engine.tick()
        assert PendingUpdate.objects.get(pk=late.pk).status == "completed"
        assert engine.answer_query(wid, "seen") == [12]
    finally:
        engine.shutdown()


def test_a_wake_up_before_the_first_look_is_not_answered_from_the_load():
    wid = "load-rt-woken"
    weft.start("tests.load_round_trips", args=[wid], id=wid)
    engine = _started("load-rt-woken-engine")
    try:
        engine._claim(db_now(), {}, set(), force=True, scan=False)
        owned = engine.owned[wid]
        assert mailbox_state(engine).prefetched[wid] == (owned, [])
        late = PendingUpdate.objects.create(
            workflow_id=wid, run_id=uuid.UUID(owned.run_id), name="add", payload="3", created_at=db_now()
        )
        # Named by a wake-up (here passed as deliver_messages' workflow ids): queried, not prefetched.
        deliver_messages(engine, {wid}, False, db_now(), {}, set())
        assert PendingUpdate.objects.get(pk=late.pk).status == "completed"
        assert engine.answer_query(wid, "seen") == [3]
    finally:
        engine.shutdown()
