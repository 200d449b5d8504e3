"""The acquire that loads what it took in the same round trip (store/claims/taking.py, PostgreSQL):
it claims what a plain acquire claims and reads what a separate load reads, whatever the ids hold; a
call that takes nothing reads nothing (not the ids an earlier call noted); a row that cannot be
converted leaves the claims held and the load to the loader, which isolates the row."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from tests.engine.test_load_round_trips import _assert_same_as_orm, _orm_state, _parked_batch
from weft_django.engine import ownership
from weft_django.models import Step, WorkflowClaim
from weft_django.store import histories, prepared
from weft_django.store.claims import taking
from weft_django.testing import running_engine, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

TTL = timedelta(seconds=30)


def test_it_claims_and_reads_what_acquire_then_load_would():
    ids = _parked_batch()
    orm = _orm_state(ids)
    assert taking.available("default")
    with CaptureQueriesContext(connections["default"]) as captured:
        claimed, loaded = taking.acquire_and_load("al-1", limit=10, ttl=TTL, using="default")
    # One round trip (after the seven statements are prepared on a connection that had not yet done so).
    sent = [q["sql"] for q in captured.captured_queries if not q["sql"].startswith("PREPARE ")]
    assert len(sent) == 1
    assert sorted(claimed) == ids
    held = dict(WorkflowClaim.objects.filter(workflow_id__in=ids).values_list("workflow_id", "epoch"))
    assert {wid: epoch for wid, (epoch, _) in claimed.items()} == held
    assert set(WorkflowClaim.objects.filter(workflow_id__in=ids).values_list("engine_id", flat=True)) == {"al-1"}
    assert loaded is not None
    _assert_same_as_orm(loaded, orm, admitted=True)


def test_the_claim_and_the_reads_are_prepared_once_per_connection_then_one_round_trip():
    connections["default"].close()  # prepared statements live as long as their connection
    ids = _parked_batch()
    with CaptureQueriesContext(connections["default"]) as first:
        taking.acquire_and_load("al-1", limit=2, ttl=TTL, using="default")
    assert [q["sql"].split(" ", 1)[0] for q in first.captured_queries] == ["PREPARE"] * 7 + ["SET"]
    with CaptureQueriesContext(connections["default"]) as second:
        claimed, loaded = taking.acquire_and_load("al-1", limit=10, ttl=TTL, using="default")
    [batch] = [q["sql"] for q in second.captured_queries]
    assert batch.count("EXECUTE weft_") == 7 and "WITH candidates" not in batch
    assert sorted(claimed) == ids[2:] and loaded is not None and sorted(loaded.runs) == ids[2:]


def test_statements_gone_from_the_server_run_plainly_with_the_same_rows():
    ids = _parked_batch()
    taking.acquire_and_load("al-1", limit=1, ttl=TTL, using="default")  # prepares them
    with connections["default"].cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # a pooler's other server connection, or DISCARD ALL
    orm = _orm_state(ids[1:])
    with CaptureQueriesContext(connections["default"]) as missed:
        claimed, loaded = taking.acquire_and_load("al-1", limit=10, ttl=TTL, using="default")
    sent = [q["sql"] for q in missed.captured_queries]
    assert "EXECUTE weft_" in sent[0] and "WITH candidates" in sent[-1]  # failed (nothing kept), then plain
    assert sorted(claimed) == ids[1:] and loaded is not None
    _assert_same_as_orm(loaded, orm, admitted=True)
    held = WorkflowClaim.objects.filter(workflow_id__in=ids, engine_id="al-1").count()
    assert held == len(ids)  # each claimed once


def test_the_prepared_claims_generic_plan_reads_the_free_index_in_order_too():
    """After a few executions PostgreSQL may plan a prepared statement once for any parameters: that
    plan too must read the free claims' index in order, stopped at the LIMIT."""
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE weft_django_workflowclaim")  # no claim is free now
    weft.start_many([weft.StartRequest("tests.load_round_trips", args=[f"g{i}"]) for i in range(300)])
    for _ in range(7):
        taking.acquire_and_load("al-1", limit=1, ttl=TTL, using="default")
    name = prepared.statement_name(taking._CLAIM_ALL)
    with transaction.atomic(), connections["default"].cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(taking._PLAN_IN_ORDER)
        cursor.execute(f"EXPLAIN EXECUTE {name}(10, 'al-1', 'al-1', 30000)")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Scan using weft_claim_free" in plan and "Bitmap" not in plan, plan


def test_the_reads_plan_does_not_depend_on_how_many_ids_the_first_batch_took():
    """The six reads are prepared without parameters: PostgreSQL plans them once per connection. If
    the planner could see the ids (a plain current_setting() is folded into its estimate), a first
    batch of thousands would fix a sequential scan of the steps for every later batch of one, until
    the next ANALYZE. Review of session 10; before the fix: Seq Scan on weft_django_step."""
    connections["default"].close()  # a connection on which nothing is prepared yet
    weft.start_many([weft.StartRequest("tests.load_round_trips", args=[f"p{i}"]) for i in range(6000)])
    step = Step._meta.db_table
    with connections["default"].cursor() as cursor:
        cursor.execute(  # five steps per run: a table a sequential scan reads all of
            f"INSERT INTO {step} (workflow_id, run_id, seq, kind, name, status, attempts, epoch, started_at) "
            "SELECT w.id, w.run_id, k, 'activity', 'x', 'completed', 1, 1, now() "
            "FROM weft_django_workflow w, generate_series(0, 4) k"
        )
        cursor.execute(f"ANALYZE {step}")
        cursor.execute("ANALYZE weft_django_workflow")
    claimed, _ = taking.acquire_and_load("al-1", limit=5000, ttl=TTL, using="default")
    assert len(claimed) == 5000  # the first EXECUTE of the reads: 5,000 ids
    name = prepared.statement_name(taking._LOADS[1])  # the steps read
    with transaction.atomic(), connections["default"].cursor() as cursor:
        cursor.execute("SELECT set_config(%s, %s, true)", [taking.SETTING, "{p-none}"])
        cursor.execute(f"EXPLAIN EXECUTE {name}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert f"Seq Scan on {step}" not in plan, plan


def test_the_reads_plans_made_on_small_tables_stay_index_lookups_once_the_tables_grow():
    """An engine's first acquire on a new database prepares the reads while the tables are small: their
    plans, made once per connection, must not keep sequential scans or hash joins for when the tables
    have grown. Session 10's benchmark: 221 instead of 1,374 workflows/s, 185 ms per batch of 50."""
    connections["default"].close()  # a connection on which nothing is prepared yet
    weft.start_many([weft.StartRequest("tests.load_round_trips", args=[f"s{i}"]) for i in range(5)])
    taking.acquire_and_load("al-1", limit=5, ttl=TTL, using="default")  # prepared on five runs
    weft.start_many([weft.StartRequest("tests.load_round_trips", args=[f"g{i}"]) for i in range(6000)])
    step = Step._meta.db_table
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {step} (workflow_id, run_id, seq, kind, name, status, attempts, epoch, started_at) "
            "SELECT w.id, w.run_id, k, 'activity', 'x', 'completed', 1, 1, now() "
            "FROM weft_django_workflow w, generate_series(0, 4) k"
        )
    claimed, loaded = taking.acquire_and_load("al-1", limit=50, ttl=TTL, using="default")
    assert len(claimed) == 50 and loaded is not None and len(loaded.runs) == 50
    with transaction.atomic(), connections["default"].cursor() as cursor:
        for setting in taking._PLAN_FOR_FEW_IDS:
            cursor.execute(setting)
        cursor.execute("SELECT set_config(%s, %s, true)", [taking.SETTING, "{none}"])
        plans = []
        for sql in taking._LOADS:
            name = prepared.statement_name(sql)
            if "%s" in sql:  # the admitted updates' read takes the status
                cursor.execute(f"EXPLAIN EXECUTE {name}(%s)", [histories.ADMITTED_PARAM])
            else:
                cursor.execute(f"EXPLAIN EXECUTE {name}")
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    for plan in plans:
        assert not any(shape in plan for shape in ("Seq Scan", "Hash Join", "Hash Semi Join", "Merge")), plan


def test_a_call_that_takes_nothing_reads_nothing():
    ids = _parked_batch()
    first, loaded = taking.acquire_and_load("al-1", limit=10, ttl=TTL, using="default")
    assert sorted(first) == ids and loaded is not None and sorted(loaded.runs) == ids
    again, nothing = taking.acquire_and_load("al-1", limit=10, ttl=TTL, using="default")
    assert again == {}
    assert nothing is not None and (nothing.runs, nothing.steps, nothing.timers, nothing.admitted) == ({}, {}, {}, {})
    assert taking.acquire_and_load("al-1", limit=0, ttl=TTL, using="default") == ({}, None)


@pytest.mark.parametrize("wid", ["comma,id", 'quote"id', "{brace}", "back\\slash", "space id", "NULL", "ünï"])
def test_ids_that_need_quoting_in_an_array_round_trip(wid):
    with running_engine("al-start"):
        handle = weft.start("tests.load_round_trips", args=[wid], id=wid)
        wait_for(lambda: Step.objects.filter(workflow_id=handle.id).exists(), timeout=20, message="a step")
    claimed, loaded = taking.acquire_and_load("al-1", limit=10, ttl=TTL, using="default")
    assert list(claimed) == [wid]
    assert loaded is not None and list(loaded.runs) == [wid]
    assert loaded.runs[wid].run_id in loaded.steps and loaded.steps[loaded.runs[wid].run_id]


def test_an_unconvertible_row_leaves_the_claims_held_and_the_load_to_the_loader(monkeypatch):
    ids = _parked_batch()

    def broken(*args: Any) -> None:
        raise ValueError("a row the decoder cannot convert")

    monkeypatch.setattr(histories, "_decode_steps", broken)
    claimed, loaded = taking.acquire_and_load("al-1", limit=10, ttl=TTL, using="default")
    assert sorted(claimed) == ids and loaded is None
    assert set(WorkflowClaim.objects.filter(workflow_id__in=ids).values_list("engine_id", flat=True)) == {"al-1"}
    with connections["default"].cursor() as cursor:  # the connection is usable: no result set left over
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_inside_a_transaction_the_engine_acquires_then_loads():
    with transaction.atomic():
        assert not taking.available("default")
        assert ownership.acquire_and_load("al-1", limit=10, ttl=TTL, using="default") is None


def test_the_claim_statement_reads_the_free_index_in_order_whatever_the_statistics():
    """Statistics taken while no claim was free make the planner expect a handful: without the
    statement's own setting it may read every free claim (a bitmap scan and a sort) before the LIMIT."""
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE weft_django_workflowclaim")  # no claim is free now
    weft.start_many([weft.StartRequest("tests.load_round_trips", args=[f"k{i}"]) for i in range(300)])
    claim_sql = taking._claim_and_note(False)
    params = [10, "al-1", "al-1", 30000]
    with transaction.atomic(), connections["default"].cursor() as cursor:
        cursor.execute(taking._PLAN_IN_ORDER)
        cursor.execute("EXPLAIN " + claim_sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Scan using weft_claim_free" in plan and "Bitmap" not in plan, plan


def test_an_acquire_and_load_that_fails_falls_back_to_acquire_then_load(monkeypatch):
    """One transaction: a load that keeps failing would roll back the claim every pass and keep the
    oldest batch from every engine; the pass then claims first and loads after."""
    from django.db import DatabaseError

    from weft_django.engine.engine import Engine

    ids = _parked_batch()

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("canceling statement due to statement timeout")

    monkeypatch.setattr(taking, "acquire_and_load", failing)
    engine = Engine("al-fallback")
    engine.start()
    try:
        engine.tick()
        assert sorted(engine.owned) == ids
    finally:
        engine.shutdown()


def test_the_acquire_alone_commits_without_waiting_for_its_flush():
    """docs/decisions/0015: the acquire-and-load transaction, and only it, has synchronous_commit off;
    the setting ends with it (the session's next transaction, a fenced commit, waits for its flush)."""
    ids = _parked_batch()
    with CaptureQueriesContext(connections["default"]) as captured:
        claimed, loaded = taking.acquire_and_load("al-1", limit=10, ttl=TTL, using="default")
    [batch] = [q["sql"] for q in captured.captured_queries if not q["sql"].startswith("PREPARE ")]
    assert batch.startswith("SET LOCAL synchronous_commit = off;")
    assert sorted(claimed) == ids and loaded is not None and sorted(loaded.runs) == ids
    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
