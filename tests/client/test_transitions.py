"""External transitions: cancel, suspend, resume, retry, time_out, purge; epochs; concurrency."""

from __future__ import annotations

import functools
import threading
import time

import pytest
from django.apps import apps
from django.db import OperationalError, connection, transaction

import weft_django as weft
from weft_django import transitions
from weft_django.exceptions import (
    WorkflowNotFoundError,
    WorkflowStateError,
    WorkflowTerminalError,
)
from weft_django.models import (
    AppliedUpdate,
    BufferedSignal,
    EpochCounter,
    IdempotencyKey,
    PendingUpdate,
    QueryRequest,
    Step,
    Timer,
    Workflow,
    WorkflowClaim,
)
from weft_django.store import epochs, notify
from weft_django.store import mailbox as store_mailbox
from weft_django.store.clock import db_now
from weft_django.store.notify import parse_signal

ACTIVE = ["pending", "running", "suspended"]
TERMINAL = ["completed", "failed", "cancelled", "timed_out"]


@weft.workflow(name="transition_tests.simple")
def simple(ctx):
    yield ctx.sleep(1)


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in apps.get_app_config("weft_django").get_models()}


def claim(workflow_id: str) -> WorkflowClaim:
    return WorkflowClaim.objects.get(pk=workflow_id)


def wf(workflow_id: str) -> Workflow:
    return Workflow.objects.get(pk=workflow_id)


def set_status(workflow_id: str, status: str, **fields) -> None:
    Workflow.objects.filter(pk=workflow_id).update(status=status, **fields)


def held(workflow_id: str, engine: str = "engine-a") -> None:
    """Pretend an engine owns the workflow."""
    now = db_now()
    WorkflowClaim.objects.filter(pk=workflow_id).update(engine_id=engine, claimed_at=now, expires_at=now)


def step(workflow_id: str, seq: int, status: str = "completed", kind: str = "activity") -> Step:
    run_id = wf(workflow_id).run_id
    return Step.objects.create(
        workflow_id=workflow_id, run_id=run_id, seq=seq, kind=kind, name=f"s{seq}", status=status, epoch=1,
        started_at=db_now(),
    )  # fmt: skip


def mailbox(workflow_id: str) -> None:
    """A buffered and a consumed signal, an admitted and a completed update, a timer."""
    run_id, now = wf(workflow_id).run_id, db_now()
    BufferedSignal.objects.create(workflow_id=workflow_id, run_id=run_id, name="a", payload="1", created_at=now)
    BufferedSignal.objects.create(
        workflow_id=workflow_id,
        run_id=run_id,
        name="b",
        payload="2",
        created_at=now,
        state="consumed",
        consumed_seq=0,
    )
    PendingUpdate.objects.create(workflow_id=workflow_id, run_id=run_id, name="u", payload="1", created_at=now)
    PendingUpdate.objects.create(
        workflow_id=workflow_id,
        run_id=run_id,
        name="v",
        payload="1",
        created_at=now,
        status="completed",
        result="2",
    )
    Timer.objects.create(workflow_id=workflow_id, run_id=run_id, kind="sleep", seq=0, fire_at=now)


def start(workflow_id: str, **fields) -> weft.WorkflowHandle:
    handle = weft.start(simple, id=workflow_id)
    if fields:
        Workflow.objects.filter(pk=workflow_id).update(**fields)
    return handle


# ------------------------------------------------------------------------------------------- cancel


@pytest.mark.django_db
@pytest.mark.parametrize("status", ACTIVE)
def test_cancel_ends_the_run_and_deposes_the_owner(status):
    handle = start("c1", status=status)
    held("c1")
    mailbox("c1")
    epoch = claim("c1").epoch
    handle.cancel("no longer needed")
    row = wf("c1")
    assert row.status == "cancelled" and row.cancel_reason == "no longer needed"
    assert row.finished_at is not None and row.updated_at == row.finished_at
    after = claim("c1")
    assert after.epoch > epoch
    assert (after.engine_id, after.claimed_at, after.expires_at) == (None, None, None)
    assert sorted(BufferedSignal.objects.values_list("name", "state")) == [
        ("a", "dropped"),
        ("b", "consumed"),
    ]
    failed = PendingUpdate.objects.get(name="u")
    assert failed.status == "failed" and failed.completed_at is not None
    assert failed.error == {
        "type": "WorkflowTerminalError",
        "message": 'Workflow "c1" was cancelled before this update was applied.',
    }
    assert PendingUpdate.objects.get(name="v").status == "completed"
    assert not Timer.objects.exists()


@pytest.mark.django_db
def test_cancel_module_level_and_without_reason():
    start("c2")
    weft.cancel("c2")
    assert wf("c2").status == "cancelled" and wf("c2").cancel_reason is None


@pytest.mark.django_db
@pytest.mark.parametrize("status", TERMINAL)
def test_cancel_a_terminal_run(status):
    handle = start("c3", status=status)
    counts, epoch = row_counts(), claim("c3").epoch
    with pytest.raises(WorkflowTerminalError, match=rf'"c3" already ended \({status}\); there is nothing to cancel'):
        handle.cancel()
    assert row_counts() == counts and claim("c3").epoch == epoch and wf("c3").status == status


@pytest.mark.django_db
def test_transitions_of_an_unknown_workflow():
    handle = weft.get_handle("ghost")
    for call in (
        handle.cancel,
        handle.suspend,
        handle.resume,
        handle.retry,
        lambda: transitions.time_out("ghost"),
    ):
        with pytest.raises(WorkflowNotFoundError, match='No workflow "ghost" exists'):
            call()


@pytest.mark.django_db
def test_cancel_applies_parent_close_policy_to_children():
    start("parent")
    run_id = wf("parent").run_id
    children = {"parent/1": "terminate", "parent/2": "request_cancel", "parent/3": "abandon"}
    for child_id, policy in children.items():
        start(child_id, parent_id="parent", parent_run_id=run_id, parent_close_policy=policy)
        held(child_id)
    start("parent/1/1", parent_id="parent/1", parent_run_id=wf("parent/1").run_id)  # a grandchild
    start("parent/4", parent_id="parent", parent_run_id=run_id, status="completed")  # already ended
    start("old-child", parent_id="parent", parent_run_id="00000000-0000-0000-0000-000000000001")  # older run
    mailbox("parent/2")
    epochs_before = {pk: claim(pk).epoch for pk in ["parent/1", "parent/2", "parent/3"]}

    transitions.cancel("parent", "done")

    statuses = dict(Workflow.objects.values_list("pk", "status"))
    assert statuses == {
        "parent": "cancelled",
        "parent/1": "cancelled",
        "parent/2": "cancelled",
        "parent/3": "running",
        "parent/1/1": "cancelled",
        "parent/4": "completed",
        "old-child": "running",
    }
    assert wf("parent/1").cancel_reason == 'parent workflow "parent" was cancelled'
    assert wf("parent/1/1").cancel_reason == 'parent workflow "parent/1" was cancelled'
    assert claim("parent/1").epoch > epochs_before["parent/1"] and claim("parent/1").engine_id is None
    assert claim("parent/3").epoch == epochs_before["parent/3"] and claim("parent/3").engine_id == "engine-a"
    assert BufferedSignal.objects.get(name="a").state == "dropped"
    assert not Timer.objects.exists()


@pytest.mark.django_db
def test_transitions_join_the_callers_transaction():
    handle = start("t1")
    epoch = claim("t1").epoch
    with pytest.raises(RuntimeError), transaction.atomic():
        handle.cancel()
        assert wf("t1").status == "cancelled"
        raise RuntimeError
    assert wf("t1").status == "running" and claim("t1").epoch == epoch
    with transaction.atomic():
        with pytest.raises(WorkflowStateError):
            handle.resume()
        handle.suspend()  # the caller's transaction is still usable after a refused transition
    assert wf("t1").status == "suspended"


# ------------------------------------------------------------------------------------ time_out


@pytest.mark.django_db
@pytest.mark.parametrize("status", ACTIVE)
def test_time_out(status):
    start("to", status=status)
    held("to")
    mailbox("to")
    epoch = claim("to").epoch
    assert transitions.time_out("to") == claim("to").epoch > epoch
    row = wf("to")
    assert row.status == "timed_out" and row.finished_at is not None and row.cancel_reason is None
    assert claim("to").engine_id is None
    assert BufferedSignal.objects.get(name="a").state == "dropped"
    assert (
        PendingUpdate.objects.get(name="u").error["message"]
        == 'Workflow "to" was timed_out before this update was applied.'
    )
    assert not Timer.objects.exists()
    with pytest.raises(WorkflowTerminalError, match="it cannot time out"):
        transitions.time_out("to")


# ------------------------------------------------------------------------------------ suspend / resume


@pytest.mark.django_db
def test_suspend_and_resume():
    handle = start("s1")
    held("s1")
    mailbox("s1")
    first = claim("s1").epoch
    handle.suspend()
    assert wf("s1").status == "suspended"
    second = claim("s1")
    assert second.epoch > first and second.engine_id is None
    assert Timer.objects.filter(workflow_id="s1").count() == 1  # timers stay: resume re-arms them
    assert BufferedSignal.objects.get(name="a").state == "buffered"
    deadline = wf("s1").execution_deadline
    handle.resume()
    row = wf("s1")
    assert row.status == "running" and row.execution_deadline == deadline
    third = claim("s1")
    assert third.epoch > second.epoch and third.engine_id is None


ONLY_RUNNING = "only a running workflow can be suspended, and it is"
SUSPEND_ERRORS = [
    ("suspended", f"{ONLY_RUNNING} suspended."),
    ("pending", f"{ONLY_RUNNING} pending (it has not started yet: cancel it, or suspend it once it runs)."),
    ("completed", f"{ONLY_RUNNING} completed."),
    ("cancelled", f"{ONLY_RUNNING} cancelled."),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("status", "message"), SUSPEND_ERRORS)
def test_suspend_state_errors(status, message):
    handle = start("s2", status=status)
    counts, epoch = row_counts(), claim("s2").epoch
    with pytest.raises(WorkflowStateError) as caught:
        handle.suspend()
    assert str(caught.value) == f'Cannot suspend workflow "s2": {message}'
    assert row_counts() == counts and claim("s2").epoch == epoch and wf("s2").status == status


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["running", "pending", *TERMINAL])
def test_resume_state_errors(status):
    handle = start("r2", status=status)
    epoch = claim("r2").epoch
    with pytest.raises(WorkflowStateError) as caught:
        handle.resume()
    assert str(caught.value) == (
        f'Cannot resume workflow "r2": only a suspended workflow can be resumed, and it is {status}.'
    )
    assert claim("r2").epoch == epoch and wf("r2").status == status


# ------------------------------------------------------------------------------------------- retry


@pytest.mark.django_db
def test_retry_removes_the_failing_step_and_keeps_the_run():
    handle = start("f1")
    run_id = wf("f1").run_id
    step("f1", 0)
    step("f1", 1, status="failed")  # caught by the workflow earlier
    step("f1", 2)
    step("f1", 3, status="failed")  # the one that ended the run
    mailbox("f1")
    now = db_now()
    error = {"type": "ActivityError", "message": "card declined", "traceback": "", "seq": 3}  # as the engine records it
    set_status("f1", "failed", error=error, finished_at=now, stuck_attempts=2)
    store_mailbox.close_mailboxes(["f1"], now, "default")  # as the engine's terminal commit would
    held("f1")
    epoch = claim("f1").epoch

    handle.retry()

    row = wf("f1")
    assert (row.status, row.run_id, row.error, row.finished_at, row.result) == (
        "running",
        run_id,
        None,
        None,
        None,
    )
    assert row.stuck_attempts == 0
    assert sorted(Step.objects.values_list("seq", flat=True)) == [0, 1, 2]
    assert claim("f1").epoch > epoch and claim("f1").engine_id is None
    # signals and updates closed at the failure stay closed
    assert BufferedSignal.objects.get(name="a").state == "dropped"
    assert PendingUpdate.objects.get(name="u").status == "failed"


@pytest.mark.django_db
def test_retry_of_a_failure_in_workflow_code_deletes_no_step():
    handle = start("f2")
    step("f2", 0)
    set_status("f2", "failed", error={"type": "KeyError", "message": "x"})
    handle.retry()
    assert wf("f2").status == "running" and Step.objects.count() == 1


@pytest.mark.django_db
def test_retry_uses_the_seq_named_in_the_error():
    handle = start("f3")
    step("f3", 0, status="failed")
    step("f3", 1, status="failed")
    set_status("f3", "failed", error={"type": "ActivityError", "message": "x", "seq": 0})
    handle.retry()
    assert list(Step.objects.values_list("seq", flat=True)) == [1]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("status", "hint"),
    [
        ("running", " (it has not failed)"),
        ("suspended", " (it has not failed)"),
        ("completed", ' (start a new run with on_conflict="start_new" instead)'),
        ("cancelled", ' (start a new run with on_conflict="start_new" instead)'),
    ],
)
def test_retry_state_errors(status, hint):
    handle = start("f4", status=status)
    step("f4", 0, status="failed")
    with pytest.raises(WorkflowStateError) as caught:
        handle.retry()
    assert str(caught.value) == (
        f'Cannot retry workflow "f4": only a failed workflow can be retried, and it is {status}{hint}.'
    )
    assert Step.objects.count() == 1 and wf("f4").status == status


# ------------------------------------------------------------------------------------------- purge


def everything(workflow_id: str) -> None:
    run_id, now = wf(workflow_id).run_id, db_now()
    mailbox(workflow_id)
    step(workflow_id, 0)
    AppliedUpdate.objects.create(workflow_id=workflow_id, run_id=run_id, seq=0, n=0, name="u", payload="1")
    QueryRequest.objects.create(workflow_id=workflow_id, name="q", created_at=now)


@pytest.mark.django_db
def test_purge_deletes_every_row_of_terminal_workflows():
    for index, status in enumerate(TERMINAL):
        start(f"p{index}", status=status)
        everything(f"p{index}")
    start("keep", status="completed")
    everything("keep")
    assert transitions.purge(["p0", "p1", "p2", "p3", "missing"]) == 4
    assert list(Workflow.objects.values_list("pk", flat=True)) == ["keep"]
    assert list(WorkflowClaim.objects.values_list("pk", flat=True)) == ["keep"]
    for model in (Step, Timer, BufferedSignal, PendingUpdate, AppliedUpdate, QueryRequest):
        assert set(model.objects.values_list("workflow_id", flat=True)) == {"keep"}, model
    assert transitions.purge("keep") == 1
    assert not Workflow.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("status", ACTIVE)
def test_purge_refuses_active_workflows(status):
    start("done", status="completed")
    start("active", status=status)
    counts = row_counts()
    with pytest.raises(WorkflowStateError, match=r'still active: "active"\. Cancel them first'):
        transitions.purge(["done", "active"])
    with pytest.raises(WorkflowStateError):
        transitions.purge(Workflow.objects.all())
    assert row_counts() == counts


@pytest.mark.django_db
def test_purge_a_queryset_in_batches():
    for index in range(7):
        start(f"q{index}", status="completed" if index % 2 else "failed")
    start("q-running")
    purged = transitions.purge(Workflow.objects.filter(status__in=["completed", "failed"]), batch_size=3)
    assert purged == 7
    assert list(Workflow.objects.values_list("pk", flat=True)) == ["q-running"]
    assert list(WorkflowClaim.objects.values_list("pk", flat=True)) == ["q-running"]
    assert transitions.purge(Workflow.objects.filter(status="completed")) == 0


@pytest.mark.django_db
def test_purge_marks_idempotency_keys():
    handle = weft.start(simple, idempotency_key="purge-key")
    other = weft.start(simple, idempotency_key="other-key")
    set_status(handle.id, "completed")
    transitions.purge([handle.id])
    assert IdempotencyKey.objects.get(pk="purge-key").purged_at is not None
    assert IdempotencyKey.objects.get(pk="other-key").purged_at is None
    assert weft.start(simple, idempotency_key="other-key") == other


# ------------------------------------------------------------------------------------------- epochs


@pytest.mark.django_db
def test_next_epoch_strictly_increases():
    drawn = [epochs.next_epoch("default") for _ in range(5)]
    assert drawn == sorted(set(drawn))
    assert epochs.next_epoch_sql("postgresql") == "nextval('weft_django_epoch_seq')"
    assert "RETURNING value" in epochs.next_epoch_sql("sqlite")


@pytest.mark.django_db
@pytest.mark.sqlite
def test_sqlite_counter_row_is_created_on_first_use():
    EpochCounter.objects.all().delete()
    assert epochs.next_epoch("default") == 1
    assert epochs.next_epoch("default") == 2
    assert EpochCounter.objects.get().value == 2


@pytest.mark.django_db
def test_epoch_strictly_increases_across_every_transition_and_purge():
    seen = []

    def record():
        seen.append(claim("e").epoch)

    handle = start("e")
    record()
    handle.suspend()
    record()
    handle.resume()
    record()
    set_status("e", "failed")
    handle.retry()
    record()
    handle.cancel()
    record()
    weft.start(simple, id="e", on_conflict="start_new")
    record()
    transitions.time_out("e")
    record()
    transitions.purge(["e"])
    assert not WorkflowClaim.objects.filter(pk="e").exists()
    weft.start(simple, id="e")
    record()
    assert seen == sorted(seen) and len(set(seen)) == len(seen), seen


# -------------------------------------------------------------------------------------- concurrency


def race(calls):
    """Run the calls at once on their own threads and connections; return results or exceptions."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[object] = [None] * len(calls)

    def run(index, call):
        try:
            barrier.wait()
            outcomes[index] = call()
        except Exception as exc:
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("transition", "status", "error"),
    [
        (transitions.cancel, "running", WorkflowTerminalError),
        (transitions.suspend, "running", WorkflowStateError),
        (transitions.resume, "suspended", WorkflowStateError),
        (transitions.retry, "failed", WorkflowStateError),
        (transitions.time_out, "running", WorkflowTerminalError),
    ],
)
def test_two_concurrent_transitions_one_wins(transition, status, error):
    for attempt in range(5):
        workflow_id = f"race-{attempt}"
        start(workflow_id, status=status)
        outcomes = race([functools.partial(transition, workflow_id)] * 2)
        winners = [o for o in outcomes if isinstance(o, int)]
        losers = [o for o in outcomes if isinstance(o, Exception)]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        assert isinstance(losers[0], error), losers
        assert claim(workflow_id).epoch == winners[0]


@pytest.mark.django_db(transaction=True)
def test_a_transition_waits_for_the_lock_of_another():
    start("locked")
    suspended = threading.Event()
    outcome: list[object] = []

    def hold_then_commit():
        try:
            with transaction.atomic():
                transitions.suspend("locked")
                suspended.set()
                time.sleep(0.4)
        finally:
            connection.close()

    def cancel_meanwhile():
        suspended.wait()
        try:
            outcome.append(transitions.suspend("locked"))
        except Exception as exc:
            outcome.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=hold_then_commit), threading.Thread(target=cancel_meanwhile)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - started >= 0.4  # the second one waited for the first to commit
    assert isinstance(outcome[0], WorkflowStateError) and "it is suspended" in str(outcome[0])


@pytest.mark.django_db(transaction=True)
def test_cancel_and_suspend_race():
    for attempt in range(5):
        workflow_id = f"mixed-{attempt}"
        start(workflow_id)
        cancelled, suspended = race(
            [
                functools.partial(transitions.cancel, workflow_id),
                functools.partial(transitions.suspend, workflow_id),
            ]
        )
        # Cancel wins over running and suspended alike; suspend either came first or finds it cancelled.
        assert isinstance(cancelled, int), cancelled
        assert isinstance(suspended, int) or "it is cancelled" in str(suspended), suspended
        assert wf(workflow_id).status == "cancelled"
        if isinstance(suspended, int):
            assert suspended < cancelled == claim(workflow_id).epoch


# ------------------------------------------------------------------------------------ retry on deadlock


class _Deadlock(Exception):
    sqlstate = "40P01"


@pytest.mark.django_db(transaction=True)
def test_deadlocks_are_retried_when_the_transition_owns_the_transaction():
    calls = []

    def body():
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("deadlock detected") from _Deadlock()
        return "ok"

    assert transitions.run_in_transaction("default", body) == "ok"
    assert len(calls) == 3

    calls.clear()
    with pytest.raises(OperationalError), transaction.atomic():
        transitions.run_in_transaction("default", body)  # the caller owns it: only the caller can retry
    assert len(calls) == 1

    def always():
        raise OperationalError("deadlock detected") from _Deadlock()

    with pytest.raises(OperationalError):
        transitions.run_in_transaction("default", always)


@pytest.mark.django_db
def test_other_database_errors_are_not_retried():
    calls = []

    def body():
        calls.append(1)
        raise OperationalError("something else")

    with pytest.raises(OperationalError):
        transitions.run_in_transaction("default", body)
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------ wake-ups


@pytest.fixture
def listen():
    """A LISTEN connection on the weft channel; returns a function that drains the payloads."""
    import psycopg

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("LISTEN weft")

        def drain() -> list[str]:
            return [note.payload for note in conn.notifies(timeout=0.3)]

        yield drain


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_signal_too_big_to_carry_names_its_workflow_instead(listen):
    handle = start("n2")
    listen()
    handle.signal("small", "x" * 100)
    handle.signal("big", "x" * notify.MAX_CARRIED_SIGNAL)
    small, big = listen()
    assert small.startswith("S:") and len(small.encode()) <= notify.MAX_CARRIED_SIGNAL
    assert big == "w:n2"  # the engine reads this one from the mailbox
    assert BufferedSignal.objects.filter(workflow_id="n2").count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_wake_ups_are_sent_on_commit_only(listen):
    with transaction.atomic():
        handle = start("n1")
        handle.signal("s")
        assert listen() == []  # nothing before the commit
    # The signal's wake-up is sent in the transaction; the start's right after its commit, in a
    # transaction of its own (store.runs.NOTIFY_AFTER_COMMIT), so PostgreSQL does not fold the two.
    # The signal's carries its row (S:, store/notify.py).
    carried, started = listen()
    assert started == "w:n1" and carried.startswith("S:")
    signal = BufferedSignal.objects.get()
    assert parse_signal(carried[2:]) == (signal.pk, "n1", str(signal.run_id), "s", signal.payload, None)
    with pytest.raises(RuntimeError), transaction.atomic():
        handle.cancel()
        raise RuntimeError
    assert listen() == []
    handle.suspend()
    assert listen() == ["w:n1"]
    start("n1/1", parent_id="n1", parent_run_id=wf("n1").run_id)
    listen()
    handle.cancel()
    assert sorted(listen()) == ["r:n1", "r:n1/1", "w:n1", "w:n1/1"]
