"""The fenced commit's one-statement write path (PostgreSQL): every part of a batch lands as the ORM
path wrote it, for many workflows at once, and a refused workflow's writes are dropped."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from weft_django.engine import fencing, ownership
from weft_django.engine.driver import StepRecord
from weft_django.models import BufferedSignal, PendingUpdate, Step, Timer, Workflow, WorkflowClaim
from weft_django.store import commit as store_commit
from weft_django.store import prepared
from weft_django.store.clock import db_now

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ENGINE = "batch-engine"


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement commit is PostgreSQL's")


def _claimed(*ids: str) -> dict[str, tuple[str, int]]:
    for wid in ids:
        weft.start("tests.sum", args=[1, 2], id=wid)
    got = ownership.acquire(
        ENGINE, limit=len(ids), ttl=timedelta(seconds=30), renew_interval=timedelta(seconds=5), using="default"
    )
    assert set(got) == set(ids)
    runs = dict(Workflow.objects.filter(pk__in=ids).values_list("pk", "run_id"))
    return {wid: (str(runs[wid]), epoch) for wid, (epoch, _) in got.items()}


def test_a_batch_of_finishing_and_running_workflows_in_one_statement():
    runs = _claimed("ends-ok", "ends-failed", "goes-on", "deposed")
    now = db_now()
    (ok_run, ok_epoch), (bad_run, bad_epoch) = runs["ends-ok"], runs["ends-failed"]
    go_run, go_epoch = runs["goes-on"]
    # ends-ok consumes one signal and finishes in the same commit: the other signal is dropped, its
    # admitted update fails, its timer goes.
    weft.signal("ends-ok", "taken", {"n": 1})
    weft.signal("ends-ok", "left", 2)
    taken = BufferedSignal.objects.get(workflow_id="ends-ok", name="taken").pk
    update = PendingUpdate.objects.create(
        workflow_id="ends-ok", run_id=ok_run, name="u", payload="null", created_at=now
    )
    Timer.objects.create(workflow_id="ends-ok", run_id=ok_run, kind="sleep", seq=9, fire_at=now + timedelta(hours=1))
    error = {"exc": "ActivityError", "message": 'bad "quote" \\ and ünïcode', "attempts": 2}
    batch = [
        store_commit.WorkflowWrites(
            "ends-ok",
            ok_run,
            ok_epoch,
            steps=[
                StepRecord(0, "activity", "add", "running", attempts=1),
                StepRecord(0, "activity", "add", "completed", "3", attempts=1),  # the last state wins
                StepRecord(1, "signal", "taken", "completed", '{"n":1}'),
            ],
            signals_consumed=[(taken, 1)],
            finish=store_commit.Finish("completed", result="3"),
        ),
        store_commit.WorkflowWrites(
            "ends-failed",
            bad_run,
            bad_epoch,
            steps=[StepRecord(0, "activity", "add", "failed", error=error, attempts=2)],
            finish=store_commit.Finish("failed", error={"type": "ActivityError", "message": "bad"}),
        ),
        store_commit.WorkflowWrites(
            "goes-on", go_run, go_epoch, steps=[StepRecord(0, "activity", "add", "running", attempts=1)]
        ),
        store_commit.WorkflowWrites(
            "deposed", runs["deposed"][0], runs["deposed"][1] - 1, steps=[StepRecord(0, "activity", "add", "running")]
        ),
    ]
    with CaptureQueriesContext(connection) as queries:
        result = fencing.fenced_commit(ENGINE, batch, now, "default")
    assert result.committed == {"ends-ok", "ends-failed", "goes-on"}
    assert result.lost == {"deposed": "deposed"}
    # The fence and the whole batch's writes in one statement (run as a prepared statement: its PREPARE
    # is sent once per connection) ...
    prepares = [q["sql"] for q in queries if q["sql"].startswith("PREPARE weft_")]
    writes = [q["sql"] for q in queries if q["sql"].startswith("SET LOCAL enable_seqscan = off;")]
    assert len(writes) == 1 and len(prepares) <= 1
    assert writes[0].count("EXECUTE weft_") + writes[0].count("WITH raw") == 1  # the SETs, then the statement
    assert len(queries) == 2 + len(prepares)  # ... and the read that says why "deposed" was refused

    ok = Workflow.objects.get(pk="ends-ok")
    assert (ok.status, ok.result, ok.error, ok.finished_at, ok.current_step) == ("completed", "3", None, now, "")
    bad = Workflow.objects.get(pk="ends-failed")
    assert (bad.status, bad.result, bad.error) == ("failed", None, {"type": "ActivityError", "message": "bad"})
    assert Workflow.objects.get(pk="goes-on").status == "running"

    steps = {(s.workflow_id, s.seq): s for s in Step.objects.all()}
    assert set(steps) == {("ends-ok", 0), ("ends-ok", 1), ("ends-failed", 0), ("goes-on", 0)}
    assert (steps["ends-ok", 0].status, steps["ends-ok", 0].result, steps["ends-ok", 0].completed_at) == (
        "completed",
        "3",
        now,
    )
    assert steps["ends-ok", 0].epoch == ok_epoch and steps["ends-ok", 0].started_at == now
    assert steps["ends-failed", 0].error == error and steps["ends-failed", 0].attempts == 2
    assert steps["goes-on", 0].status == "running" and steps["goes-on", 0].completed_at is None

    signals = dict(BufferedSignal.objects.filter(workflow_id="ends-ok").values_list("name", "state"))
    assert signals == {"taken": "consumed", "left": "dropped"}
    assert BufferedSignal.objects.get(pk=taken).consumed_seq == 1
    failed = PendingUpdate.objects.get(pk=update.pk)
    assert failed.status == "failed" and failed.error["type"] == "WorkflowTerminalError"
    assert not Timer.objects.filter(workflow_id="ends-ok").exists()

    claims = dict(WorkflowClaim.objects.values_list("workflow_id", "engine_id"))
    assert claims["ends-ok"] is None and claims["ends-failed"] is None  # released, epochs kept
    assert claims["goes-on"] == ENGINE and claims["deposed"] == ENGINE
    assert WorkflowClaim.objects.get(pk="ends-ok").epoch == ok_epoch


def test_a_second_commit_updates_the_step_and_keeps_when_it_began():
    runs = _claimed("twice")
    run_id, epoch = runs["twice"]
    began = db_now()
    fencing.fenced_commit(
        ENGINE,
        [store_commit.WorkflowWrites("twice", run_id, epoch, steps=[StepRecord(0, "activity", "add", "running")])],
        began,
        "default",
    )
    later = began + timedelta(seconds=5)
    done = StepRecord(0, "activity", "add", "completed", "3", attempts=1, started_at=None)
    fencing.fenced_commit(ENGINE, [store_commit.WorkflowWrites("twice", run_id, epoch, steps=[done])], later, "default")
    step = Step.objects.get(workflow_id="twice")
    assert (step.status, step.result, step.started_at, step.completed_at) == ("completed", "3", began, later)


def test_a_big_batch_takes_the_general_path():
    """One statement per commit only for small batches; a big one is lock + writes in one transaction."""
    writes = [
        store_commit.WorkflowWrites(f"w{i}", "r", 1, steps=[StepRecord(0, "activity", "a", "running")])
        for i in range(17)
    ]
    assert store_commit._fits_one_statement(writes[: store_commit.ONE_STATEMENT_MAX_WORKFLOWS], "default")
    assert not store_commit._fits_one_statement(writes, "default")
    runs = _claimed(*(f"big-{i}" for i in range(17)))
    batch = [
        store_commit.WorkflowWrites(wid, run, epoch, steps=[StepRecord(0, "activity", "add", "running", attempts=1)])
        for wid, (run, epoch) in runs.items()
    ]
    now = db_now()
    with CaptureQueriesContext(connection) as queries:
        result = fencing.fenced_commit(ENGINE, batch, now, "default")
    assert result.committed == set(runs) and result.lost == {}
    # lock (after the commit's SET LOCAL lock_timeout, in the same query string), then writes
    assert [q["sql"].split()[0] for q in queries] == ["BEGIN", "SET", "WITH", "COMMIT"]
    assert Step.objects.filter(workflow_id__in=list(runs)).count() == 17


def test_the_parent_lookup_only_for_runs_that_may_have_children(monkeypatch):
    """The one statement looks for active children only of finishing runs that started one
    (WorkflowWrites.started_children, as the general path reads it): a childless run's terminal
    commit has no parent_id scan; a run with an active child is still left to the general path."""
    runs = _claimed("lone", "dad")
    weft.start("tests.signals", id="dad-kid")
    Workflow.objects.filter(pk="dad-kid").update(parent_id="dad", parent_run_id=runs["dad"][0], parent_seq=1)
    seen: list[str] = []
    execute_statements = prepared.execute_statements

    def spy(cursor, conn, statements):  # type: ignore[no-untyped-def]
        seen.append(statements[-1][0])  # after the SETs of prepared.KEYED_PLAN
        execute_statements(cursor, conn, statements)

    monkeypatch.setattr(prepared, "execute_statements", spy)

    def ending(wid: str, *, children: bool) -> store_commit.WorkflowWrites:
        run_id, epoch = runs[wid]
        step = StepRecord(0, "activity", "add", "completed", "3", attempts=1)
        finish = store_commit.Finish("completed", result="3")
        return store_commit.WorkflowWrites(wid, run_id, epoch, steps=[step], finish=finish, started_children=children)

    result = fencing.fenced_commit(ENGINE, [ending("lone", children=False)], db_now(), "default")
    assert result.committed == {"lone"}
    assert len(seen) == 1 and "ended AS" in seen[0] and "parent_id" not in seen[0]
    assert Workflow.objects.get(pk="lone").status == "completed"
    assert WorkflowClaim.objects.get(pk="lone").engine_id is None

    seen.clear()
    result = fencing.fenced_commit(ENGINE, [ending("dad", children=True)], db_now(), "default")
    assert result.committed == {"dad"}
    assert "parent_id" in seen[0]  # found the active child: the general path closed the family
    assert Workflow.objects.get(pk="dad").status == "completed"
    assert Workflow.objects.get(pk="dad-kid").status not in ("pending", "running", "suspended")


def test_the_commit_plans_made_on_small_tables_stay_index_lookups_once_the_tables_grow():
    """An engine's first commits on a new database plan the one-statement commit while the tables are
    small; PostgreSQL keeps the generic plan from the sixth run until the next ANALYZE. That plan must
    not keep sequential scans or hash joins for when the tables have grown (benchmarks: the fenced
    commit went from 1.5 to 9.5 ms after 20,000 runs, until a new connection planned it again)."""
    connection.close()  # a connection on which nothing is prepared yet
    sent: list[tuple[str, list[object]]] = []

    def capture(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if "EXECUTE weft_" in sql:
            sent.append((sql, list(params or ())))
        return execute(sql, params, many, context)

    def finishing(wid: str) -> None:
        run_id, epoch = _claimed(wid)[wid]
        step = StepRecord(0, "activity", "add", "completed", "3", attempts=1)
        writes = store_commit.WorkflowWrites(wid, run_id, epoch, steps=[step], finish=store_commit.Finish("completed"))
        with connection.execute_wrapper(capture):
            assert fencing.fenced_commit(ENGINE, [writes], db_now(), "default").committed == {wid}

    for i in range(7):  # five custom plans, then the generic one
        finishing(f"small-{i}")
    grown = [h.id for h in weft.start_many([weft.StartRequest("tests.sum", args=[1, i]) for i in range(3000)])]
    Workflow.objects.filter(pk__in=grown).update(status="completed")  # ended: not for the acquire below
    WorkflowClaim.objects.filter(pk__in=grown).update(runnable=False)
    finishing("grown")
    sql, params = sent[-1]
    name = sql[sql.index("EXECUTE weft_") + len("EXECUTE ") :].split("(", 1)[0]
    call = sql[sql.index("EXECUTE weft_") :]
    with connection.cursor() as cursor:
        cursor.execute("SELECT generic_plans FROM pg_prepared_statements WHERE name = %s", [name])
        assert cursor.fetchone()[0] >= 2  # the plan made on the small tables served the grown ones
        cursor.execute("BEGIN")
        try:
            for setting in prepared.KEYED_PLAN:
                cursor.execute(setting)  # as the engine sends it
            cursor.execute("EXPLAIN " + call, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("ROLLBACK")
    assert not any(shape in plan for shape in ("Seq Scan", "Hash Join", "Hash Semi Join", "Merge")), plan
