"""The client: start (every option and conflict rule), idempotency keys, signals, describe, result()."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.apps import apps
from django.db import DatabaseError, connection, transaction

import weft_django as weft
from weft_django import client, codec, transitions, waits
from weft_django.client import InvalidArgumentError, InvalidWorkflowIdError
from weft_django.exceptions import (
    IdempotencyKeyPurgedError,
    PayloadNotSerializableError,
    PayloadSizeExceededError,
    WorkflowAlreadyExistsError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowNotFoundError,
    WorkflowNotRegisteredError,
    WorkflowTerminalError,
    WorkflowTimedOutError,
)
from weft_django.models import (
    BufferedSignal,
    IdempotencyKey,
    PendingUpdate,
    Step,
    Timer,
    Workflow,
    WorkflowClaim,
)
from weft_django.store.clock import db_now
from weft_django.testing import wait_for


@weft.workflow(name="client_tests.simple")
def simple(ctx, *args, **kwargs):
    yield ctx.sleep(1)
    return args


@weft.workflow(name="client_tests.other", version="7")
def other(ctx):
    yield ctx.sleep(1)


def not_a_workflow(ctx):
    yield None


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in apps.get_app_config("weft_django").get_models()}


def claim(workflow_id: str) -> WorkflowClaim:
    return WorkflowClaim.objects.get(pk=workflow_id)


def finish(workflow_id: str, status: str, *, result=None, error=None, reason=None) -> None:
    """Stand-in for an engine's terminal commit (no engine exists in these tests)."""
    with transaction.atomic():
        Workflow.objects.filter(pk=workflow_id).update(
            status=status,
            result=codec.encode(result) if status == "completed" else None,
            error=error,
            cancel_reason=reason,
            finished_at=db_now(),
        )
        weft_notify("r", workflow_id)


def close_connection() -> None:
    connection.close()


def weft_notify(kind: str, workflow_id: str) -> None:
    from weft_django.store import notify

    notify.send(kind, workflow_id, "default")


@pytest.fixture(autouse=True)
def _listeners_closed():
    """The result() listener closes its connection once nobody waits (the test database must drop)."""
    yield
    deadline = time.monotonic() + 15  # LINGER (1 s) after the last waiter, on a possibly loaded machine
    while not all(listener.closed() for listener in waits._listeners.values()):
        assert time.monotonic() < deadline, "the result listener did not close"
        time.sleep(0.02)


# ------------------------------------------------------------------------------------------ start


@pytest.mark.django_db
def test_start_writes_a_running_run_with_an_unclaimed_claim():
    before = db_now()
    handle = weft.start(simple, args=(1, "two"), kwargs={"k": Decimal("1.10")})
    uuid.UUID(handle.id)  # a generated id is str(uuid4())
    row = Workflow.objects.get(pk=handle.id)
    assert row.status == "running"
    assert row.workflow_type == "client_tests.simple"
    assert row.version == "1"
    assert codec.decode(row.input) == {"args": [1, "two"], "kwargs": {"k": Decimal("1.10")}}
    assert row.created_at == row.updated_at == row.started_at
    assert before <= row.created_at <= db_now()
    assert row.finished_at is None and row.start_at is None and row.execution_deadline is None
    assert row.idempotency_key is None
    held = claim(handle.id)
    assert held.epoch > 0 and held.engine_id is None and held.expires_at is None
    assert handle.status == weft.WorkflowStatus.RUNNING
    assert Timer.objects.count() == 0


@pytest.mark.django_db
def test_start_by_name_definition_and_shortcut():
    by_name = weft.start("client_tests.other")
    assert Workflow.objects.get(pk=by_name.id).version == "7"
    by_definition = weft.start(simple.__weft_workflow__, args=[1])
    assert codec.decode(Workflow.objects.get(pk=by_definition.id).input)["args"] == [1]
    shortcut = simple.start(3, 4, flag=True)
    assert codec.decode(Workflow.objects.get(pk=shortcut.id).input) == {
        "args": [3, 4],
        "kwargs": {"flag": True},
    }


@pytest.mark.django_db
def test_start_unregistered_workflow():
    with pytest.raises(WorkflowNotRegisteredError, match=r'No workflow "client_tests\.nope"'):
        weft.start("client_tests.nope")
    with pytest.raises(WorkflowNotRegisteredError, match=r"decorate it with @weft\.workflow"):
        weft.start(not_a_workflow)
    assert Workflow.objects.count() == 0


@pytest.mark.django_db
def test_start_with_id_and_on_conflict_error():
    handle = weft.start(simple, id="order-1")
    assert handle == weft.get_handle("order-1")
    counts = row_counts()
    with pytest.raises(WorkflowAlreadyExistsError, match=r'"order-1" already exists \(client_tests\.simple, running\)'):
        weft.start(simple, id="order-1")
    assert row_counts() == counts


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["running", "pending", "suspended", "completed", "failed", "cancelled"])
def test_use_existing_returns_the_run_in_any_status(status):
    handle = weft.start(simple, id="use-1")
    Workflow.objects.filter(pk="use-1").update(status=status)
    run_id = Workflow.objects.get(pk="use-1").run_id
    counts = row_counts()
    again = weft.start(simple, id="use-1", on_conflict="use_existing", args=[9])
    assert again == handle
    assert Workflow.objects.get(pk="use-1").run_id == run_id
    assert row_counts() == counts


@pytest.mark.django_db
def test_use_existing_refuses_another_type():
    weft.start(simple, id="typed")
    with pytest.raises(WorkflowAlreadyExistsError, match=r'already exists as a "client_tests\.simple" run'):
        weft.start(other, id="typed", on_conflict="use_existing")


@pytest.mark.django_db
def test_use_existing_and_start_new_start_a_free_id():
    assert weft.start(simple, id="free-1", on_conflict="use_existing").status == "running"
    assert weft.start(simple, id="free-2", on_conflict="start_new").status == "running"


@pytest.mark.django_db
def test_start_new_replaces_a_terminal_run():
    weft.start(simple, id="again", args=[1])
    old = Workflow.objects.get(pk="again")
    old_epoch = claim("again").epoch
    now = db_now()
    Step.objects.create(
        workflow_id="again",
        run_id=old.run_id,
        seq=0,
        kind="sleep",
        status="completed",
        epoch=1,
        started_at=now,
    )
    Timer.objects.create(workflow_id="again", run_id=old.run_id, kind="sleep", fire_at=now)
    BufferedSignal.objects.create(workflow_id="again", run_id=old.run_id, name="s", payload="null", created_at=now)
    PendingUpdate.objects.create(workflow_id="again", run_id=old.run_id, name="u", payload="null", created_at=now)
    WorkflowClaim.objects.filter(pk="again").update(engine_id="engine-a")
    finish("again", "completed", result=5)

    with pytest.raises(WorkflowAlreadyExistsError):
        weft.start(simple, id="again")  # on_conflict="error" still refuses
    handle = weft.start(simple, id="again", on_conflict="start_new", args=[2])
    new = Workflow.objects.get(pk="again")
    assert handle.id == "again"
    assert new.run_id != old.run_id
    assert new.status == "running" and new.result is None and new.finished_at is None
    assert codec.decode(new.input)["args"] == [2]
    assert new.created_at > old.created_at
    assert claim("again").epoch > old_epoch and claim("again").engine_id is None
    for model in (Step, Timer, BufferedSignal, PendingUpdate):
        assert not model.objects.filter(workflow_id="again").exists(), model


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["running", "pending", "suspended"])
def test_start_new_refuses_an_active_run(status):
    weft.start(simple, id="busy")
    Workflow.objects.filter(pk="busy").update(status=status)
    counts = row_counts()
    epoch = claim("busy").epoch
    with pytest.raises(WorkflowAlreadyExistsError, match=f'"busy" is still {status}; .*Cancel it first'):
        weft.start(simple, id="busy", on_conflict="start_new")
    assert row_counts() == counts
    assert claim("busy").epoch == epoch


@pytest.mark.django_db
def test_start_new_refuses_another_type():
    weft.start(simple, id="typed-2")
    finish("typed-2", "completed")
    with pytest.raises(WorkflowAlreadyExistsError, match=r'not "client_tests\.other"'):
        weft.start(other, id="typed-2", on_conflict="start_new")


@pytest.mark.django_db
def test_start_after_is_pending_with_a_delayed_start_timer():
    before = db_now()
    handle = weft.start(simple, start_after="1h", execution_timeout="2h")
    row = Workflow.objects.get(pk=handle.id)
    assert row.status == "pending"
    assert row.started_at is None
    assert timedelta(minutes=59) < row.start_at - before < timedelta(minutes=61)
    assert row.execution_deadline == row.start_at + timedelta(hours=2)
    timer = Timer.objects.get(workflow_id=handle.id)
    assert (timer.kind, timer.fire_at, timer.run_id) == ("delayed_start", row.start_at, row.run_id)
    assert claim(handle.id).engine_id is None


@pytest.mark.django_db
def test_start_at_future_is_pending_and_past_starts_now():
    later = datetime.now(UTC) + timedelta(days=1)
    pending = weft.start(simple, start_at=later)
    assert Workflow.objects.get(pk=pending.id).status == "pending"
    assert Timer.objects.get(workflow_id=pending.id).fire_at == later
    earlier = datetime.now(UTC) - timedelta(days=1)
    running = weft.start(simple, start_at=earlier)
    row = Workflow.objects.get(pk=running.id)
    assert row.status == "running" and row.start_at is None
    assert not Timer.objects.filter(workflow_id=running.id).exists()


@pytest.mark.django_db
def test_start_after_zero_starts_now():
    row = Workflow.objects.get(pk=weft.start(simple, start_after=0).id)
    assert row.status == "running" and row.start_at is None and not Timer.objects.exists()


@pytest.mark.django_db
def test_execution_timeout_sets_the_deadline():
    handle = weft.start(simple, execution_timeout=timedelta(minutes=5))
    row = Workflow.objects.get(pk=handle.id)
    assert row.execution_deadline == row.started_at + timedelta(minutes=5)
    handle = weft.start(simple, execution_timeout=90)
    row = Workflow.objects.get(pk=handle.id)
    assert row.execution_deadline == row.started_at + timedelta(seconds=90)


@pytest.mark.django_db
def test_start_joins_the_callers_transaction():
    counts = row_counts()
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.start(simple, id="rolled-back")
        weft.start(simple, idempotency_key="rolled-back-key")
        raise RuntimeError("the caller's transaction fails")
    assert row_counts() == counts


@pytest.mark.django_db
def test_a_refused_start_leaves_the_callers_transaction_usable():
    with transaction.atomic():
        weft.start(simple, id="kept")
        with pytest.raises(WorkflowAlreadyExistsError):
            weft.start(simple, id="kept")
        weft.start(simple, id="kept-too")  # the transaction is still usable
    assert set(Workflow.objects.values_list("pk", flat=True)) == {"kept", "kept-too"}


@pytest.mark.django_db
@pytest.mark.postgres
def test_start_query_count(django_assert_num_queries):
    # one statement: now + epoch, workflow, claim, NOTIFY (no savepoint: a taken id cannot raise)
    with django_assert_num_queries(1):
        weft.start(simple, args=[1])
    with django_assert_num_queries(1):
        weft.start(simple, id="counted", start_after="1h", execution_timeout=60)
    with django_assert_num_queries(1):
        weft.start(simple, idempotency_key="counted-key")


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_start_in_autocommit_is_one_statement_then_its_wakeup():
    from django.test.utils import CaptureQueriesContext

    from weft_django.store import notify

    listener = notify.connect("default")
    notify.listen(listener)

    def received() -> list[str]:
        listener.execute("SELECT 1")  # notifications arrive with the next round trip
        return [n.payload for n in listener.notifies(timeout=0.2, stop_after=100)]

    try:
        with CaptureQueriesContext(connection) as queries:
            weft.start(simple, args=[1], id="autocommit-first")
        # The statement is prepared once per connection (weft_django/prepared.py); then the start, its
        # commit and its wake-up in a transaction of its own go in ONE round trip
        # (store.runs.NOTIFY_PIPELINED).
        assert [q["sql"].split(" ", 1)[0] for q in queries] == ["PREPARE", "BEGIN;"]
        sql = queries[1]["sql"]
        assert sql.index("EXECUTE weft_") < sql.index("COMMIT;") < sql.index("pg_notify")
        assert received() == ["w:autocommit-first"]
        with CaptureQueriesContext(connection) as queries:
            handle = weft.start(simple, args=[1], id="autocommit")
        assert len(queries) == 1 and queries[0]["sql"].startswith("BEGIN; EXECUTE weft_")
        assert received() == ["w:autocommit"]
        row = Workflow.objects.get(pk=handle.id)
        assert row.status == "running" and row.created_at == row.started_at
        assert claim(handle.id).engine_id is None
        counts, epoch = row_counts(), claim(handle.id).epoch
        with pytest.raises(WorkflowAlreadyExistsError):
            weft.start(simple, id="autocommit")
        assert received() == []  # nothing inserted: no wake-up
        assert row_counts() == counts and claim(handle.id).epoch == epoch
    finally:
        listener.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_pipelined_start_whose_wake_up_fails_after_the_commit_returns_its_handle(monkeypatch, caplog):
    """The start commits before its wake-up runs: a wake-up that fails then (a full notification
    queue) is logged, the handle returned, the session left usable; a start that itself fails raises."""
    from weft_django.store import runs

    # What a failing NOTIFY looks like from here: the statement after the COMMIT raises.
    monkeypatch.setattr(runs, "_PIPELINED_WAKE", "SELECT 1 / 0 WHERE %s <> %s OR %s IS NOT NULL")
    handle = weft.start(simple, args=[1], id="wake-fails")
    assert Workflow.objects.filter(pk="wake-fails").count() == 1 and claim(handle.id).engine_id is None
    assert "wake-up not sent" in caplog.text
    monkeypatch.undo()
    with pytest.raises(WorkflowAlreadyExistsError):  # the connection is usable: nothing left open
        weft.start(simple, id="wake-fails")
    # A start that fails before its commit (here: inside the BEGIN) raises, and writes nothing.
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION weft_test_refuse() RETURNS trigger AS "
            "$$ BEGIN RAISE EXCEPTION 'weft test: start refused'; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE TRIGGER weft_test_refuse BEFORE INSERT ON weft_django_workflow "
            "FOR EACH ROW EXECUTE FUNCTION weft_test_refuse()"
        )
    try:
        counts = row_counts()
        with pytest.raises(DatabaseError, match="start refused"):
            weft.start(simple, id="start-fails")
        assert row_counts() == counts
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER weft_test_refuse ON weft_django_workflow")
            cursor.execute("DROP FUNCTION weft_test_refuse()")
    weft.start(simple, id="start-after")  # the session is outside any transaction again
    assert Workflow.objects.filter(pk="start-after").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_pipelined_start_whose_wake_up_fails_with_a_missing_statement_code_is_not_run_again(monkeypatch):
    """0A000 or 26000 from the statement AFTER the commit says nothing about the prepared start (which
    committed): it must not be taken for a statement gone from the server and run again (it would find
    its own row and report the id taken). Review of session 10; before the fix:
    WorkflowAlreadyExistsError."""
    from weft_django.store import runs

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION weft_test_0a000(a text, b text, c uuid) RETURNS int AS "
            "$$ BEGIN RAISE EXCEPTION 'not supported' USING ERRCODE = '0A000'; END $$ LANGUAGE plpgsql"
        )
    try:
        monkeypatch.setattr(runs, "_PIPELINED_WAKE", "SELECT weft_test_0a000(%s, %s, %s)")
        handle = weft.start(simple, id="wake-0a000")
        assert handle.id == "wake-0a000" and Workflow.objects.filter(pk="wake-0a000").count() == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP FUNCTION weft_test_0a000(text, text, uuid)")


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_an_interrupted_pipelined_start_leaves_the_connection_usable():
    """A KeyboardInterrupt while the start runs inside its BEGIN: psycopg cancels the statement, which
    leaves the server session in a failed transaction block; it is rolled back, so the connection stays
    usable. Review of session 10; before the fix the status was INERROR and every later statement failed."""
    import signal as signals

    import psycopg

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION weft_test_slow() RETURNS trigger AS "
            "$$ BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$ LANGUAGE plpgsql"
        )
    weft.start(simple, id="interrupt-warm")  # prepared, so the next start is the pipelined form
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TRIGGER weft_test_slow BEFORE INSERT ON weft_django_workflow "
            "FOR EACH ROW EXECUTE FUNCTION weft_test_slow()"
        )

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signals.signal(signals.SIGALRM, interrupt)
    signals.setitimer(signals.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            weft.start(simple, id="interrupted")
    finally:
        signals.setitimer(signals.ITIMER_REAL, 0)
        signals.signal(signals.SIGALRM, previous)
        status = connection.connection.info.transaction_status
        if status != psycopg.pq.TransactionStatus.IDLE:
            connection.connection.rollback()
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER weft_test_slow ON weft_django_workflow")
            cursor.execute("DROP FUNCTION weft_test_slow()")
    assert status == psycopg.pq.TransactionStatus.IDLE
    assert not Workflow.objects.filter(pk="interrupted").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_connection_lost_after_the_pipelined_commit_still_returns_the_handle(monkeypatch):
    """The connection dies after the start's COMMIT, during its wake-up: the start committed, so it
    returns its handle; whether it landed is read on a connection of its own."""
    import threading

    import psycopg

    from weft_django.store import runs

    weft.start(simple, id="lost-warm")
    pid = connection.connection.info.backend_pid
    slow = runs._PIPELINED_WAKE.replace("SELECT pg_notify", "SELECT pg_sleep(2), pg_notify")
    monkeypatch.setattr(runs, "_PIPELINED_WAKE", slow)
    params = {k: v for k, v in connection.get_connection_params().items() if k in ("host", "port", "user", "dbname")}

    def terminate() -> None:
        time.sleep(0.5)
        with psycopg.connect(**params, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])

    killer = threading.Thread(target=terminate)
    killer.start()
    try:
        handle = weft.start(simple, id="lost-after-commit")
    finally:
        killer.join()
        connection.close()
    assert handle.id == "lost-after-commit" and Workflow.objects.filter(pk="lost-after-commit").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_start_wakes_listeners_after_its_commit_and_never_after_a_rollback():
    """The wake-up of start() and start_many() is sent once the caller's transaction commits (its own
    transaction, after the commit), and not at all when it rolls back."""
    from weft_django.store import notify

    listener = notify.connect("default")
    try:
        notify.listen(listener)

        def received() -> list[str]:
            listener.execute("SELECT 1")  # notifications arrive with the next round trip
            return [n.payload for n in listener.notifies(timeout=0.2, stop_after=100)]

        received()
        with transaction.atomic():
            weft.start(simple, id="wake-committed")
            weft.start_many([weft.StartRequest(simple, id="wake-many")])
            assert received() == []  # not before the commit
        assert sorted(received()) == ["w:wake-committed", "w:wake-many"]
        with pytest.raises(RuntimeError), transaction.atomic():
            weft.start(simple, id="wake-rolled-back")
            weft.start_many([weft.StartRequest(simple, id=f"wake-many-{i}") for i in range(100)])
            raise RuntimeError("roll back")
        assert received() == []
        weft.start_many([weft.StartRequest(simple, id=f"wake-big-{i}") for i in range(100)])
        assert received() == ["w:*"]  # a big call: one wake-up, every engine rescans
    finally:
        listener.close()


# ---------------------------------------------------------------------------------- idempotency keys


@pytest.mark.django_db
def test_idempotency_key_returns_the_same_run():
    first = weft.start(simple, idempotency_key="order-42", args=[1])
    uuid.UUID(first.id)
    row = Workflow.objects.get(pk=first.id)
    assert row.idempotency_key == "order-42"
    mapping = IdempotencyKey.objects.get(pk="order-42")
    assert (mapping.workflow_id, mapping.run_id, mapping.purged_at) == (first.id, row.run_id, None)
    counts = row_counts()
    assert weft.start(simple, idempotency_key="order-42", args=[2]) == first
    assert row_counts() == counts
    finish(first.id, "completed")
    assert weft.start(simple, idempotency_key="order-42") == first  # in any status


@pytest.mark.django_db
def test_idempotency_key_of_another_type():
    weft.start(simple, idempotency_key="k-typed")
    with pytest.raises(WorkflowAlreadyExistsError, match=r'not "client_tests\.other"'):
        weft.start(other, idempotency_key="k-typed")


@pytest.mark.django_db
def test_idempotency_key_after_purge():
    handle = weft.start(simple, idempotency_key="k-purged")
    finish(handle.id, "completed")
    assert transitions.purge([handle.id]) == 1
    assert IdempotencyKey.objects.get(pk="k-purged").purged_at is not None
    counts = row_counts()
    with pytest.raises(
        IdempotencyKeyPurgedError, match=r'"k-purged" started workflow .* was purged on .*Use a new key'
    ):
        weft.start(simple, idempotency_key="k-purged")
    assert row_counts() == counts


@pytest.mark.django_db
def test_idempotency_key_of_a_replaced_run():
    handle = weft.start(simple, idempotency_key="k-replaced")
    finish(handle.id, "failed")
    weft.start(simple, id=handle.id, on_conflict="start_new")
    with pytest.raises(IdempotencyKeyPurgedError, match="purged or replaced"):
        weft.start(simple, idempotency_key="k-replaced")


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_with_one_key_make_one_run():
    threads, results, errors = 8, [], []
    barrier = threading.Barrier(threads)

    def start_one():
        try:
            barrier.wait()
            results.append(weft.start(simple, idempotency_key="k-race").id)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=start_one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert len(results) == threads and len(set(results)) == 1
    assert Workflow.objects.count() == 1 and WorkflowClaim.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_with_one_id():
    threads, outcomes = 6, []
    barrier = threading.Barrier(threads)

    def start_one():
        try:
            barrier.wait()
            weft.start(simple, id="id-race")
            outcomes.append("started")
        except WorkflowAlreadyExistsError:
            outcomes.append("exists")
        finally:
            connection.close()

    workers = [threading.Thread(target=start_one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(outcomes) == ["exists"] * (threads - 1) + ["started"]


# ------------------------------------------------------------------------------------- bad input

BAD_STARTS = [
    (
        dict(id="x", idempotency_key="k"),
        InvalidArgumentError,
        "id and idempotency_key are mutually exclusive",
    ),
    (dict(start_after="1m", start_at=datetime.now(UTC)), InvalidArgumentError, "mutually exclusive"),
    (dict(on_conflict="replace"), InvalidArgumentError, 'on_conflict must be "error", "use_existing" or'),
    (dict(id=""), InvalidWorkflowIdError, "1 to 255 characters long"),
    (dict(id="x" * 256), InvalidWorkflowIdError, r"1 to 255 characters long \(got 256\)"),
    (dict(id="a\nb"), InvalidWorkflowIdError, r"control characters \(found '\\n' at index 1\)"),
    (dict(id="a\x00"), InvalidWorkflowIdError, "control characters"),
    (dict(id=42), InvalidWorkflowIdError, "id must be a str"),
    (dict(idempotency_key=""), InvalidArgumentError, "idempotency_key must be a str of 1 to 320"),
    (dict(idempotency_key="k" * 321), InvalidArgumentError, r"idempotency_key .* \(got 321 characters\)"),
    (dict(start_after="soon"), InvalidArgumentError, "start_after must be a duration"),
    (dict(start_after=-5), InvalidArgumentError, "start_after must not be negative"),
    (dict(start_at="2030-01-01"), InvalidArgumentError, "start_at must be a datetime"),
    (dict(start_at=datetime(2030, 1, 1)), InvalidArgumentError, "start_at must be timezone-aware"),
    (dict(execution_timeout="5 parsecs"), InvalidArgumentError, "execution_timeout must be a duration"),
    (dict(execution_timeout=0), InvalidArgumentError, "execution_timeout must be greater than zero"),
    (dict(execution_timeout=True), InvalidArgumentError, "execution_timeout must be a duration"),
    (dict(args="abc"), InvalidArgumentError, r"args must be a list or tuple .* pass args=\[value\]"),
    (dict(args=5), InvalidArgumentError, "args must be a list or tuple"),
    (dict(kwargs=[1]), InvalidArgumentError, "kwargs must be a dict with str keys"),
    (dict(kwargs={1: 2}), InvalidArgumentError, "kwargs must be a dict with str keys"),
    (
        dict(args=[1, {"items": [1, 2, 3, object()]}]),
        PayloadNotSerializableError,
        r"^args\[1\]\['items'\]\[3\]: ",
    ),
    (dict(kwargs={"x": float("nan")}), PayloadNotSerializableError, r"^kwargs\['x'\]: "),
    (dict(args=["x" * 1_100_000]), PayloadSizeExceededError, "over the limit of 1048576 bytes"),
    (dict(id="existing"), WorkflowAlreadyExistsError, '"existing" already exists'),
    (dict(id="existing", on_conflict="start_new"), WorkflowAlreadyExistsError, "is still running"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("options", "error", "message"), BAD_STARTS)
def test_bad_start_input_changes_nothing(options, error, message):
    existing = weft.start(simple, id="existing")
    existing.signal("hello", 1)
    counts, epoch = row_counts(), claim("existing").epoch
    with pytest.raises(error, match=message) as caught:
        weft.start(simple, **options)
    assert row_counts() == counts
    assert claim("existing").epoch == epoch
    if error is PayloadNotSerializableError:
        assert caught.value.path in ("args[1]['items'][3]", "kwargs['x']")


@pytest.mark.django_db
def test_errors_are_typed():
    assert issubclass(InvalidArgumentError, weft.WeftError) and issubclass(InvalidArgumentError, ValueError)
    assert issubclass(InvalidWorkflowIdError, InvalidArgumentError)


@pytest.mark.django_db(transaction=True)
def test_bad_start_inside_a_committed_transaction_writes_nothing():
    with transaction.atomic():
        weft.start(simple, id="committed")
        with pytest.raises(InvalidArgumentError):
            weft.start(simple, id="bad", start_after="never")
    assert list(Workflow.objects.values_list("pk", flat=True)) == ["committed"]


# ------------------------------------------------------------------------------------------ handles


@pytest.mark.django_db
def test_get_handle_is_lazy(django_assert_num_queries):
    with django_assert_num_queries(0):
        handle = weft.get_handle("nobody")
    assert handle.id == "nobody" and repr(handle) == "<WorkflowHandle 'nobody'>"
    with pytest.raises(WorkflowNotFoundError):
        _ = handle.status
    with pytest.raises(InvalidWorkflowIdError):
        weft.get_handle("")


@pytest.mark.django_db
def test_describe():
    handle = weft.start(simple, id="described", execution_timeout="1h")
    row = Workflow.objects.get(pk="described")
    info = handle.describe()
    assert set(info) == {
        "id", "status", "workflow_type", "version", "run_id", "owner_engine", "epoch", "claim_expires_at",
        "created_at", "started_at", "finished_at", "current_step", "pending_timers",
    }  # fmt: skip
    assert info["id"] == "described" and info["status"] == "running"
    assert info["workflow_type"] == "client_tests.simple" and info["version"] == "1"
    assert info["run_id"] == row.run_id
    assert info["owner_engine"] is None and info["claim_expires_at"] is None
    assert info["epoch"] == claim("described").epoch
    assert info["created_at"] == row.created_at and info["started_at"] == row.started_at
    assert info["finished_at"] is None and info["current_step"] is None and info["pending_timers"] == 0

    now = db_now()
    WorkflowClaim.objects.filter(pk="described").update(engine_id="engine-a", expires_at=now)
    Timer.objects.create(workflow_id="described", run_id=row.run_id, kind="sleep", seq=1, fire_at=now)
    Timer.objects.create(workflow_id="described", run_id=row.run_id, kind="activity_retry", seq=2, fire_at=now)
    for seq, kind, name in [(0, "activity", "charge"), (1, "sleep", "")]:
        Step.objects.create(
            workflow_id="described",
            run_id=row.run_id,
            seq=seq,
            kind=kind,
            name=name,
            status="completed",
            epoch=1,
            started_at=now,
        )
    info = handle.describe()
    assert info["owner_engine"] == "engine-a" and info["claim_expires_at"] == now
    assert info["pending_timers"] == 2
    assert info["current_step"] == "#1 sleep"
    Workflow.objects.filter(pk="described").update(current_step="waiting for approve")
    assert handle.describe()["current_step"] == "waiting for approve"


@pytest.mark.django_db
def test_describe_query_count(django_assert_num_queries):
    handle = weft.start(simple)
    with django_assert_num_queries(1):
        handle.describe()
    with pytest.raises(WorkflowNotFoundError):
        weft.get_handle("missing").describe()


# ------------------------------------------------------------------------------------------- signal


@pytest.mark.django_db
def test_signal_buffers_for_the_current_run():
    handle = weft.start(simple)
    run_id = Workflow.objects.get(pk=handle.id).run_id
    handle.signal("approve", {"by": "ann", "at": datetime(2024, 1, 1, tzinfo=UTC)})
    weft.signal(handle.id, "approve")
    rows = list(BufferedSignal.objects.order_by("id"))
    assert [(r.run_id, r.name, r.state, r.signal_id) for r in rows] == [(run_id, "approve", "buffered", None)] * 2
    assert codec.decode(rows[0].payload) == {"by": "ann", "at": datetime(2024, 1, 1, tzinfo=UTC)}
    assert codec.decode(rows[1].payload) is None
    assert rows[0].created_at <= rows[1].created_at <= db_now()


@pytest.mark.django_db
def test_duplicate_signal_id_is_a_no_op():
    handle = weft.start(simple, id="dedupe")
    handle.signal("pay", 1, signal_id="sig-1")
    handle.signal("pay", 2, signal_id="sig-1")  # a retry: ignored, payload included
    handle.signal("other", 3, signal_id="sig-1")
    handle.signal("pay", 4, signal_id="sig-2")
    handle.signal("pay", 5, signal_id="s" * 320)
    assert [codec.decode(p) for p in BufferedSignal.objects.order_by("id").values_list("payload", flat=True)] == [
        1,
        4,
        5,
    ]
    finish("dedupe", "completed")
    weft.start(simple, id="dedupe", on_conflict="start_new")
    handle.signal("pay", 6, signal_id="sig-1")  # unique per run: the new run accepts it
    assert codec.decode(BufferedSignal.objects.get().payload) == 6


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["pending", "suspended"])
def test_signal_to_pending_or_suspended(status):
    handle = weft.start(simple)
    Workflow.objects.filter(pk=handle.id).update(status=status)
    handle.signal("s")
    assert BufferedSignal.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["completed", "failed", "cancelled", "timed_out"])
def test_signal_to_a_terminal_run(status):
    handle = weft.start(simple, id="ended")
    finish("ended", status)
    with pytest.raises(WorkflowTerminalError, match=rf'"ended": it already ended \({status}\)'):
        handle.signal("s", signal_id="x")
    assert BufferedSignal.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: weft.signal("nobody", "s"),
            WorkflowNotFoundError,
            'Cannot signal workflow "nobody": no such',
        ),
        (lambda: weft.signal("", "s"), InvalidWorkflowIdError, "1 to 255"),
        (lambda: weft.signal("sig", ""), InvalidArgumentError, "name must be a str of 1 to 255"),
        (
            lambda: weft.signal("sig", "s", signal_id="x" * 321),
            InvalidArgumentError,
            "signal_id must be a str",
        ),
        (lambda: weft.signal("sig", "s", signal_id=""), InvalidArgumentError, "signal_id must be a str"),
        (
            lambda: weft.signal("sig", "s", {"a": {1, object()}}),
            PayloadNotSerializableError,
            r"^payload\['a'\]",
        ),
        (lambda: weft.signal("sig", "s", "x" * 1_100_000), PayloadSizeExceededError, "payload is"),
    ],
)
def test_bad_signals_change_nothing(call, error, message):
    weft.start(simple, id="sig")
    counts = row_counts()
    with pytest.raises(error, match=message):
        call()
    assert row_counts() == counts


@pytest.mark.django_db
def test_signal_joins_the_callers_transaction():
    handle = weft.start(simple)
    with pytest.raises(RuntimeError), transaction.atomic():
        handle.signal("s", 1)
        raise RuntimeError
    assert BufferedSignal.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.postgres
def test_signal_query_count(django_assert_num_queries):
    handle = weft.start(simple)
    # one statement: the insert-select with the NOTIFY riding in it (no savepoint, no separate NOTIFY)
    with django_assert_num_queries(1):
        handle.signal("s", 1, signal_id="a")
    with django_assert_num_queries(2):  # a repeat: nothing inserted, nothing sent; the status read says why
        handle.signal("s", 2, signal_id="a")


# ------------------------------------------------------------------------------------------- result


VALUE = {"total": Decimal("12.00"), "items": (1, 2), "ids": {uuid.UUID(int=1)}}


def finish_later(workflow_id: str, delay: float, **outcome) -> threading.Timer:
    def run():
        try:
            finish(workflow_id, **outcome)
        finally:
            connection.close()

    timer = threading.Timer(delay, run)
    timer.start()
    return timer


@pytest.mark.django_db(transaction=True)
def test_result_waits_for_completion():
    handle = weft.start(simple)
    timer = finish_later(handle.id, 0.3, status="completed", result=VALUE)
    try:
        assert handle.result(timeout=10) == VALUE
    finally:
        timer.join()


@pytest.mark.django_db(transaction=True)
def test_result_inside_atomic_for_a_run_committed_earlier():
    handle = weft.start(simple)
    finish(handle.id, "completed", result=VALUE)
    with transaction.atomic():
        weft.start(simple, id="uncommitted")  # the caller's transaction has writes of its own
        assert handle.result(timeout=5) == VALUE
    assert Workflow.objects.filter(pk="uncommitted").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_result_inside_atomic_waits_for_another_transaction():
    # On SQLite the caller's open transaction holds the only write lock, so no engine could commit.
    handle = weft.start(simple)
    timer = finish_later(handle.id, 0.3, status="completed", result=VALUE)
    try:
        with transaction.atomic():
            weft.start(simple, id="uncommitted")
            assert handle.result(timeout=10) == VALUE
    finally:
        timer.join()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_result_is_woken_by_notify(monkeypatch):
    # With the re-read every 60 s, only the NOTIFY can end this wait before its 30 s timeout.
    monkeypatch.setattr(waits, "LISTEN_RECHECK", 60.0)
    handle = weft.start(simple)
    timer = finish_later(handle.id, 0.5, status="completed", result=1)
    try:
        assert handle.result(timeout=30) == 1
    finally:
        timer.join()


@pytest.mark.django_db(transaction=True)
def test_result_of_ended_runs():
    ended = {}
    for status in ("failed", "cancelled", "timed_out"):
        ended[status] = weft.start(simple, execution_timeout="1h")
    error = {"type": "ValueError", "message": "bad card", "traceback": "Traceback ..."}
    finish(ended["failed"].id, "failed", error=error)
    finish(ended["cancelled"].id, "cancelled", reason="customer asked")
    finish(ended["timed_out"].id, "timed_out")
    with pytest.raises(WorkflowFailedError, match="failed: ValueError: bad card") as caught:
        ended["failed"].result()
    assert caught.value.error == error
    with pytest.raises(WorkflowCancelledError, match="was cancelled: customer asked"):
        ended["cancelled"].result()
    with pytest.raises(WorkflowTimedOutError, match="execution deadline"):
        ended["timed_out"].result()


@pytest.mark.django_db(transaction=True)
def test_result_timeout_raises_builtin_timeout_error():
    handle = weft.start(simple)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="is still running"):
        handle.result(timeout="300ms")
    assert 0.25 < time.monotonic() - started < 15
    with pytest.raises(TimeoutError):
        handle.result(timeout=0)
    with pytest.raises(InvalidArgumentError, match="timeout must be a duration"):
        handle.result(timeout="later")


@pytest.mark.django_db(transaction=True)
def test_result_does_not_see_an_uncommitted_start():
    with transaction.atomic():
        handle = weft.start(simple)
        with pytest.raises(WorkflowNotFoundError, match="has not committed yet"):
            handle.result(timeout=1)
    with pytest.raises(WorkflowNotFoundError):
        weft.get_handle("never-started").result(timeout=1)


@pytest.mark.django_db
def test_result_inside_the_test_transaction_is_not_found():
    # The test's own transaction never commits: result() reads on its own connection.
    handle = weft.start(simple)
    with pytest.raises(WorkflowNotFoundError):
        handle.result(timeout=1)


@pytest.mark.django_db(transaction=True)
def test_close_connections_ends_waits_in_progress():
    handle = weft.start(simple)
    outcome: list[object] = []

    def wait_forever():
        try:
            outcome.append(handle.result())
        except Exception as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_forever)
    waiter.start()
    wait_for(lambda: waits._open_waits, timeout=30, message="the wait to begin")
    started = time.monotonic()
    client.close_connections()
    waiter.join(30)
    assert time.monotonic() - started < 15
    assert isinstance(outcome[0], TimeoutError) and "stopped waiting" in str(outcome[0])
    assert all(listener.closed() for listener in waits._listeners.values())
    finish(handle.id, "completed", result="later")
    assert handle.result(timeout=5) == "later"  # the next wait starts the threads again


# -------------------------------------------------------------------------------------------- async


@pytest.mark.django_db(transaction=True)
def test_async_twins():
    async def scenario():
        handle = await weft.astart(simple, id="async-1", args=[1])
        await handle.asignal("s", 2, signal_id="a")
        info = await handle.adescribe()
        assert info["status"] == "running"
        await handle.asuspend()
        await handle.aresume()
        waiter = asyncio.ensure_future(handle.aresult(timeout=10))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        await handle.acancel("stop")
        with pytest.raises(WorkflowCancelledError, match="stop"):
            await waiter
        with pytest.raises(TimeoutError):
            await (await weft.astart(simple)).aresult(timeout=0.1)
        with pytest.raises(WorkflowTerminalError):
            await handle.acancel()
        await sync_to_async(close_connection)()  # on the thread that ran the sync parts

    asyncio.run(scenario())
    assert BufferedSignal.objects.get().state == "dropped"
