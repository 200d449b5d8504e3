"""Queries and updates routed through the database to an engine running in this process (a thread),
on PostgreSQL and SQLite: outcomes, validators, idempotency, replay, wait_for_update, with-start."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

import weft_django as weft
from weft_django.engine import messages
from weft_django.engine.engine import Engine
from weft_django.exceptions import InvalidArgumentError, InvalidWorkflowIdError
from weft_django.models import (
    AppliedUpdate,
    BufferedSignal,
    PendingUpdate,
    QueryRequest,
    Step,
    Workflow,
    WorkflowClaim,
)
from weft_django.store import notify
from weft_django.store.clock import db_now
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Engines:
    """Engines running in threads of this process (the running_engine pattern, several at a time)."""

    def __init__(self) -> None:
        self.running: list[tuple[Engine, threading.Thread]] = []

    def start(self, engine_id: str = "msg-engine") -> Engine:
        engine = Engine(engine_id)

        def run() -> None:
            try:
                engine.run()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, daemon=True, name=f"engine-{engine_id}")
        thread.start()
        self.running.append((engine, thread))
        return engine

    def stop(self, engine: Engine) -> None:
        for candidate, thread in self.running:
            if candidate is engine:
                engine.request_stop()
                thread.join(timeout=20)
                assert not thread.is_alive()

    def stop_all(self) -> None:
        for engine, _ in self.running:
            self.stop(engine)


@pytest.fixture
def engines():
    group = Engines()
    yield group
    group.stop_all()


def owned(engine: Engine, workflow_id: str) -> None:
    wait_for(lambda: workflow_id in engine.owned, timeout=20, message=f"{engine.engine_id} to own {workflow_id}")


def table_counts() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (Workflow, PendingUpdate, QueryRequest, BufferedSignal, AppliedUpdate, Step)
    }


# ------------------------------------------------------------------------------------------- queries


def test_query_outcomes(engines):
    handle = weft.start("tests.msg_counter", id="q-outcomes")
    engine = engines.start()
    owned(engine, handle.id)
    assert handle.query("count") == 0  # an exposed accessor
    assert handle.query("echo") == "no arg"  # called with no argument when arg is omitted
    assert handle.query("echo", {"a": (1, 2)}) == {"a": (1, 2)}  # the argument round-trips exactly
    assert handle.query("echo", None) is None  # an explicit None is an argument
    assert weft.query(handle.id, "notes") == []
    assert handle.query("activity_progress") is None  # built in: no activity running
    with pytest.raises(weft.QueryNotFoundError, match="nope"):
        handle.query("nope")
    with pytest.raises(weft.QueryFailedError) as failed:
        handle.query("boom")
    assert failed.value.error["type"] == "ZeroDivisionError"
    with pytest.raises(weft.WorkflowNotFoundError):
        weft.query("no-such-workflow", "count")
    handle.cancel()
    assert handle.query("count") is None  # terminal: None, as in weft
    assert QueryRequest.objects.filter(status="answered").count() == 6


def test_activity_progress_and_accessors_over_the_wire(engines):
    # The activity runs far longer than the queries take, even on a loaded machine; cancelling the run
    # stops it at its next heartbeat.
    handle = weft.start("tests.progress", args=[60.0], id="q-progress")
    engine = engines.start()
    owned(engine, handle.id)
    progress = wait_for(lambda: handle.query("activity_progress"), timeout=30, message="a heartbeat")
    assert progress["step"] >= 1
    assert handle.query("stage") == "working"
    assert handle.query("echo", 5) == 5
    handle.cancel()


def test_query_with_no_engine_times_out_saying_why():
    handle = weft.start("tests.msg_counter", id="q-unheld")
    started = time.monotonic()
    with pytest.raises(weft.QueryTimeoutError, match="no engine holds it") as info:
        handle.query("count", timeout="300ms")
    assert time.monotonic() - started >= 0.3
    assert '"q-unheld"' in str(info.value) and "weft_engine" in str(info.value)
    handle.suspend()
    with pytest.raises(weft.QueryTimeoutError, match="suspended"):
        handle.query("count", timeout="200ms")
    assert not QueryRequest.objects.exists()  # nothing was addressed to a missing engine


def test_a_stale_context_does_not_answer(engines):
    """weft 0.21: a live context is re-validated against the durable holder before it answers."""
    handle = weft.start("tests.msg_counter", id="q-stale")
    engine = engines.start()
    owned(engine, handle.id)
    epoch = WorkflowClaim.objects.get(pk=handle.id).epoch
    # Another engine took the workflow over behind this one's back (its renewal has not noticed yet).
    WorkflowClaim.objects.filter(pk=handle.id).update(engine_id="ghost", epoch=epoch + 1000)
    request = QueryRequest.objects.create(
        workflow_id=handle.id, engine_id=engine.engine_id, name="count", created_at=db_now()
    )
    with transaction.atomic():
        notify.send("q", engine.engine_id, "default")
    wait_for(lambda: QueryRequest.objects.get(pk=request.pk).status != "pending", timeout=10)
    answered = QueryRequest.objects.get(pk=request.pk)
    assert answered.status == "failed" and answered.result is None
    assert answered.error["reason"] == "not_owned" and answered.error["type"] == "WorkflowNotLocallyOwnedError"
    assert "another engine currently owns it" in answered.error["message"]
    wait_for(lambda: handle.id not in engine.owned, timeout=10, message="the stale context to be dropped")


# ------------------------------------------------------------------------------------------- updates


def test_update_applies_and_wait_until_is_rechecked(engines):
    handle = weft.start("tests.msg_counter", id="u-apply")
    engine = engines.start()
    owned(engine, handle.id)
    assert handle.update("add", 3) == 3
    assert handle.query("stage") == "counting"
    assert weft.update(handle.id, "add", 7) == 10  # the wait_until(count >= 10) is re-evaluated now
    wait_for(lambda: handle.query("stage") == "reached", timeout=10, message="wait_until to settle")
    applied = list(AppliedUpdate.objects.filter(workflow_id=handle.id).order_by("seq", "n").values_list("seq", "n"))
    assert applied == [(0, 0), (0, 1)]
    assert set(PendingUpdate.objects.values_list("status", flat=True)) == {"completed"}
    assert Step.objects.get(workflow_id=handle.id, seq=0).result == "true"
    handle.signal("stop", "now")
    result = handle.result(timeout=10)
    assert result["count"] == 10 and result["reached"] is True


VALIDATION_CASES = [
    ("add", "x", "amount must be an int > 0", [{"message": "amount must be an int > 0", "path": None}]),
    (
        "multi",
        1,
        "first problem; x[0]: second",
        [{"message": "first problem", "path": None}, {"message": "second", "path": ["x", 0]}],
    ),
    (
        "form_note",
        {"text": "far too long a note", "priority": 0},
        None,
        [
            {"message": "Ensure this value has at most 10 characters (it has 19).", "path": ["text"]},
            {"message": "Ensure this value is greater than or equal to 1.", "path": ["priority"]},
        ],
    ),
    ("form_note", "not a dict", "NoteForm expects a dict of form fields, not str", None),
    ("django_note", "no", "value: must be 'ok'; rejected as a whole", None),
]


def test_validator_rejections_leave_the_run_unchanged_and_are_visible(engines):
    handle = weft.start("tests.msg_counter", id="u-reject")
    engine = engines.start()
    owned(engine, handle.id)
    for name, payload, joined, issues in VALIDATION_CASES:
        with pytest.raises(weft.UpdateValidationError) as info:
            handle.update(name, payload)
        if joined is not None:
            assert str(info.value) == f'Update "{name}" rejected by validator: {joined}'
        if issues is not None:
            assert info.value.issues == issues
        row = PendingUpdate.objects.get(name=name)
        assert row.status == "rejected" and row.issues == info.value.issues and row.completed_at is not None
        PendingUpdate.objects.filter(pk=row.pk).delete()
    with pytest.raises(weft.UpdateValidationError) as typed:
        handle.update("typed_note", {"text": 1})
    assert [issue["path"] for issue in typed.value.issues] == [["text"], ["priority"]]  # pydantic's locations
    assert str(typed.value).startswith('Update "typed_note" rejected by validator: ')
    assert django_issues(handle) == [
        {"message": "must be 'ok'", "path": ["value"]},
        {"message": "rejected as a whole", "path": None},
    ]
    # Nothing changed: no handler ran and nothing goes to the applied-update log.
    assert handle.query("count") == 0 and handle.query("notes") == [] and handle.query("calls") == 0
    assert not AppliedUpdate.objects.exists()
    # The same validators accept good payloads.
    assert handle.update("form_note", {"text": "short", "priority": 2}) == 1
    assert handle.update("typed_note", {"text": "typed", "priority": 1}) == 2
    assert handle.update("django_note", "ok") == 3
    assert AppliedUpdate.objects.count() == 3


def django_issues(handle) -> list:
    with pytest.raises(weft.UpdateValidationError) as info:
        handle.update("django_note", "still no")
    return info.value.issues


def test_failures_of_handlers_and_validators(engines):
    handle = weft.start("tests.msg_counter", id="u-fail")
    engine = engines.start()
    owned(engine, handle.id)
    with pytest.raises(weft.UpdateFailedError, match="handler broke") as broke:
        handle.update("broken", 5)
    assert broke.value.error["type"] == "RuntimeError" and broke.value.error["stage"] == "handler"
    # The run goes on, with whatever the handler changed before raising (it is recorded, and replayed).
    assert handle.query("count") == 1000
    assert AppliedUpdate.objects.get(name="broken").error["type"] == "RuntimeError"
    with pytest.raises(weft.UpdateFailedError) as validator:
        handle.update("validator_raises", 1)
    assert validator.value.error["type"] == "ZeroDivisionError" and validator.value.error["stage"] == "validator"
    with pytest.raises(weft.UpdateFailedError) as result:
        handle.update("bad_result", 1)
    assert result.value.error["type"] == "PayloadNotSerializableError"
    assert handle.query("notes") == []
    assert AppliedUpdate.objects.count() == 2  # broken and bad_result ran; the refused validator did not
    assert handle.status == "running"


def test_idempotent_retries_apply_once(engines):
    handle = weft.start("tests.msg_counter", id="u-idem")
    engine = engines.start()
    owned(engine, handle.id)
    assert handle.update("add", 2, idempotency_key="k1") == 2
    assert handle.update("add", 2, idempotency_key="k1") == 2  # the stored response
    results: list = []

    def send() -> None:
        try:
            results.append(handle.update("add", 5, idempotency_key="k2", timeout="10s"))
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [7, 7, 7, 7]
    assert handle.query("calls") == 2 and handle.query("count") == 7
    assert PendingUpdate.objects.count() == 2 and AppliedUpdate.objects.count() == 2
    with pytest.raises(InvalidArgumentError, match='already used for update "add"'):
        handle.update("form_note", {}, idempotency_key="k1")


def test_a_timed_out_update_expires_and_the_same_key_readmits_it(engines):
    handle = weft.start("tests.msg_counter", id="u-expire")
    with pytest.raises(weft.UpdateTimeoutError, match="expired and will never be applied"):
        handle.update("add", 1, idempotency_key="again", timeout="300ms")
    row = PendingUpdate.objects.get()
    assert row.status == "expired" and row.completed_at is not None
    engine = engines.start()
    owned(engine, handle.id)
    time.sleep(0.3)  # the engine saw the expired request and left it alone
    assert handle.query("calls") == 0
    assert handle.update("add", 1, idempotency_key="again") == 1  # re-admitted, then applied once
    assert handle.query("calls") == 1
    assert PendingUpdate.objects.get().status == "completed"


def test_an_update_nothing_handles_stays_unapplied_and_expires(engines):
    handle = weft.start("tests.msg_counter", id="u-unknown")
    engine = engines.start()
    owned(engine, handle.id)
    with pytest.raises(weft.UpdateTimeoutError, match='does the workflow handle\\s+"nope"'):
        handle.update("nope", 1, timeout="500ms")
    assert PendingUpdate.objects.get().status == "expired"
    assert handle.query("calls") == 0 and not AppliedUpdate.objects.exists()


def test_an_update_to_an_unheld_run_waits_for_an_engine(engines):
    handle = weft.start("tests.msg_counter", id="u-later")
    starter = threading.Timer(0.5, lambda: engines.start())
    starter.start()
    try:
        assert handle.update("add", 4, timeout="20s") == 4
    finally:
        starter.join()


def test_update_to_terminal_and_unknown_runs(engines):
    handle = weft.start("tests.msg_counter", id="u-terminal")
    engine = engines.start()
    owned(engine, handle.id)
    assert handle.update("add", 1, idempotency_key="before-end") == 1
    handle.cancel()
    with pytest.raises(weft.WorkflowTerminalError, match="already ended"):
        handle.update("add", 1)
    assert handle.update("add", 1, idempotency_key="before-end") == 1  # a stored response outlives the run
    with pytest.raises(weft.WorkflowNotFoundError):
        weft.update("no-such-workflow", "add", 1)


def test_an_admitted_update_fails_when_the_run_is_cancelled(engines):
    handle = weft.start("tests.msg_counter", id="u-cancelled")
    outcome: list = []

    def send() -> None:
        try:
            handle.update("add", 1, timeout="10s")
        except Exception as exc:
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=send)
    thread.start()
    wait_for(lambda: PendingUpdate.objects.exists(), timeout=5)
    handle.cancel()
    thread.join()
    assert isinstance(outcome[0], weft.WorkflowTerminalError)
    assert PendingUpdate.objects.get().status == "failed"


def test_state_changed_by_updates_survives_replay(engines, monkeypatch):
    handle = weft.start("tests.msg_counter", id="u-replay")
    first = engines.start("first")
    owned(first, handle.id)
    assert handle.update("add", 3) == 3
    assert handle.update("form_note", {"text": "kept", "priority": 1}) == 1
    with pytest.raises(weft.UpdateValidationError):
        handle.update("add", -1)
    with pytest.raises(weft.UpdateFailedError):
        handle.update("broken", "x")
    assert handle.update("add", 4) == 1007
    wait_for(lambda: handle.query("stage") == "reached", timeout=10)
    engines.stop(first)  # claims released: the next engine replays from scratch
    assert WorkflowClaim.objects.get(pk=handle.id).engine_id is None

    def no_validators(*args):  # replay re-applies recorded updates without their validators
        raise AssertionError("a validator ran on replay")

    monkeypatch.setattr(messages, "validation_issues", no_validators)
    second = engines.start("second")
    owned(second, handle.id)
    assert handle.query("count") == 1007
    assert handle.query("notes") == [{"text": "kept", "priority": 1}]
    assert handle.query("calls") == 2  # the rejected update was never applied, live or on replay
    assert handle.query("stage") == "reached"
    # broken took the count past 10, so the wait_until settled and the last add arrived at the next yield.
    assert list(AppliedUpdate.objects.order_by("seq", "n").values_list("seq", "n", "name")) == [
        (0, 0, "add"),
        (0, 1, "form_note"),
        (0, 2, "broken"),
        (1, 0, "add"),
    ]
    handle.signal("stop", 1)
    assert handle.result(timeout=10)["count"] == 1007


def test_updates_survive_run_until_idle_replays(weft_run_until_idle):
    """Each run_until_idle() releases its claims, so the next one replays from scratch."""
    handle = weft.start("tests.msg_counter", kwargs={"target": 6}, id="u-idle")
    weft_run_until_idle()
    outcome: list = []

    def send() -> None:
        try:
            outcome.append(handle.update("add", 6, timeout="20s"))
        finally:
            connection.close()

    thread = threading.Thread(target=send)
    thread.start()
    wait_for(lambda: PendingUpdate.objects.exists(), timeout=5)
    weft_run_until_idle()
    thread.join()
    assert outcome == [6]
    handle.signal("stop", "x")
    weft_run_until_idle()  # replays: the update is re-applied at seq 0 before the wait_until is fed
    assert handle.result(timeout=5) == {"count": 6, "reached": True, "stop": "x", "notes": []}
    assert AppliedUpdate.objects.get().seq == 0


def test_wait_for_update_and_respond(engines):
    handle = weft.start("tests.msg_confirm", id="u-confirm")
    engine = engines.start()
    owned(engine, handle.id)
    assert handle.update("confirm", "yes") == {"ok": True, "got": "yes"}
    assert handle.query("confirmed") == "yes"
    assert handle.update("confirm", "again", timeout="10s") == {"total": 3, "got": "again"}
    assert handle.result(timeout=10) == ["yes", "again"]
    steps = Step.objects.filter(workflow_id=handle.id, kind="update").order_by("seq")
    assert [(s.seq, s.name) for s in steps] == [(0, "confirm"), (1, "confirm")]
    assert '"yes"' in steps[0].result  # the step records the payload (and the update it came from)
    assert set(PendingUpdate.objects.values_list("status", flat=True)) == {"completed"}
    assert not AppliedUpdate.objects.exists()


def test_wait_for_update_takes_an_update_sent_before_it_waits(engines):
    handle = weft.start("tests.msg_confirm", id="u-early")
    results: list = []

    def send() -> None:
        try:
            results.append(handle.update("confirm", "early", timeout="20s"))
        finally:
            connection.close()

    thread = threading.Thread(target=send)
    thread.start()
    wait_for(lambda: PendingUpdate.objects.exists(), timeout=5)
    engines.start()
    thread.join()
    assert results == [{"ok": True, "got": "early"}]


def test_wait_for_update_not_answered_in_time_stays_accepted(weft_run_until_idle):
    handle = weft.start("tests.msg_confirm", id="u-accepted")
    weft_run_until_idle()
    admit_confirm(handle, "first")
    weft_run_until_idle()  # answered by respond() right away
    assert PendingUpdate.objects.get(idempotency_key="first").status == "completed"
    with pytest.raises(weft.UpdateTimeoutError, match="taken by its wait_for_update"):
        # Taken by the second wait_for_update, whose respond() comes after an activity: no engine runs now.
        accept_without_answer(handle)
    assert PendingUpdate.objects.get(idempotency_key="second").status == "accepted"
    weft_run_until_idle()  # replays; respond() is live again (not replaying) and completes it
    assert handle.update("confirm", "ignored", idempotency_key="second") == {"total": 3, "got": "second"}


def test_a_respond_commits_with_the_next_update_taken_in_the_same_pass(monkeypatch, weft_run_until_idle):
    """Two updates taken by two wait_for_update in one pass: the first one's respond() must be durable
    with the second one's step, or replay would skip it (a later step exists) and leave it unanswered."""
    handle = weft.start("tests.msg_confirm", id="u-two-in-one")
    run_id = Workflow.objects.get(pk=handle.id).run_id
    now = db_now()
    for n, key in enumerate(("one", "two")):
        PendingUpdate.objects.create(
            workflow_id=handle.id,
            run_id=run_id,
            name="confirm",
            payload=f'"{key}"',
            idempotency_key=key,
            created_at=now + timedelta(milliseconds=n),
        )
    engine = Engine("dies-before-its-batch-commit")
    monkeypatch.setattr(engine, "_commit", lambda batch, now: set())  # the tick's own commit never lands
    engine.start()
    try:
        for _ in range(50):
            engine.tick()
            if PendingUpdate.objects.filter(idempotency_key="two", status="accepted").exists():
                break
            time.sleep(0.02)
        first = PendingUpdate.objects.get(idempotency_key="one")
        assert first.status == "completed" and '"one"' in first.result
    finally:
        engine.shutdown()
    weft_run_until_idle()  # replays both update steps; the second respond() comes after the activity
    assert handle.update("confirm", "x", idempotency_key="two") == {"total": 3, "got": "two"}
    assert handle.result(timeout=5) == ["one", "two"]


def admit_confirm(handle, key: str) -> None:
    """Admit a "confirm" update with payload and idempotency key ``key`` directly (no caller waits)."""
    PendingUpdate.objects.create(
        workflow_id=handle.id,
        run_id=Workflow.objects.get(pk=handle.id).run_id,
        name="confirm",
        payload=f'"{key}"',
        idempotency_key=key,
        created_at=db_now(),
    )


def accept_without_answer(handle) -> None:
    """Admit update "second" and run an engine until its wait_for_update took it (accepted), then stop
    the engine before the activity that comes before respond() is committed. Then ask for it: the
    wait runs out while it is accepted. (Admitted directly, so a slow engine start on a loaded machine
    cannot make the caller's own wait expire it first.)"""
    admit_confirm(handle, "second")
    engine = Engine("accepting")
    engine.start()
    try:
        deadline = time.monotonic() + 60
        while not PendingUpdate.objects.filter(idempotency_key="second", status="accepted").exists():
            assert time.monotonic() < deadline, "the engine did not accept the update"
            engine.tick()
            time.sleep(0.02)
        engine.executor.shutdown(0)  # stop before the activity's result is committed
    finally:
        engine.shutdown()
    handle.update("confirm", "second", idempotency_key="second", timeout="300ms")


# ---------------------------------------------------------------------------------------- with-start


def test_start_or_signal(weft_run_until_idle):
    handle, outcome = weft.start_or_signal("tests.signals", "go", "first", id="sos")
    assert outcome == "started" and handle.status == "running"
    run_id = Workflow.objects.get(pk="sos").run_id
    assert weft.start_or_signal("tests.signals", "go", "ignored", id="sos", signal_id="s1")[1] == "signalled"
    assert weft.start_or_signal("tests.signals", "go", "dup", id="sos", signal_id="s1")[1] == "signalled"
    assert BufferedSignal.objects.filter(workflow_id="sos").count() == 2
    weft_run_until_idle()
    assert handle.result(timeout=5) == "first"
    # A finished run is replaced (as on_conflict="start_new") and the new run gets the signal.
    handle, outcome = weft.start_or_signal("tests.signals", "go", "second", id="sos")
    assert outcome == "started" and Workflow.objects.get(pk="sos").run_id != run_id
    weft_run_until_idle()
    assert handle.result(timeout=5) == "second"
    before = table_counts()
    with pytest.raises(weft.WorkflowAlreadyExistsError, match='already exists as a "tests.signals" run'):
        weft.start_or_signal("tests.msg_other", "go", 1, id="sos")
    assert table_counts() == before


def test_start_or_signal_is_atomic_inside_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.start_or_signal("tests.signals", "go", 1, id="sos-rollback")
        raise RuntimeError
    assert not Workflow.objects.filter(pk="sos-rollback").exists() and not BufferedSignal.objects.exists()


def test_start_with_update(engines):
    engines.start()
    handle, result = weft.start_with_update("tests.msg_counter", "add", 5, id="swu", timeout="20s")
    assert result == 5 and handle.id == "swu"
    handle, result = weft.start_with_update("tests.msg_counter", "add", 6, id="swu", idempotency_key="k")
    assert result == 11
    assert weft.start_with_update("tests.msg_counter", "add", 6, id="swu", idempotency_key="k")[1] == 11
    assert handle.query("calls") == 2
    before = table_counts()
    with pytest.raises(weft.WorkflowAlreadyExistsError):
        weft.start_with_update("tests.msg_other", "add", 1, id="swu")
    assert table_counts() == before
    with pytest.raises(weft.UpdateValidationError):
        weft.start_with_update("tests.msg_counter", "add", "x", id="swu")
    handle.cancel()
    run_id = Workflow.objects.get(pk="swu").run_id
    handle, result = weft.start_with_update("tests.msg_counter", "add", 1, id="swu", timeout="20s")
    assert result == 1 and Workflow.objects.get(pk="swu").run_id != run_id  # a new run took it


# ----------------------------------------------------------------------------------------- bad input


class Unserialisable:
    pass


BAD_INPUT = [
    (lambda h: h.update("add", Unserialisable()), weft.PayloadNotSerializableError, "payload"),
    (lambda h: h.update("add", {"x": [1, Unserialisable()]}), weft.PayloadNotSerializableError, r"payload\['x'\]\[1\]"),
    (lambda h: h.update("add", 1, timeout="soon"), InvalidArgumentError, "timeout"),
    (lambda h: h.update("add", 1, timeout=0), InvalidArgumentError, "greater than zero"),
    (lambda h: h.update("add", 1, timeout=-1), InvalidArgumentError, "timeout"),
    (lambda h: h.update("add", 1, timeout=None), InvalidArgumentError, "bounded"),
    (lambda h: h.update("add", 1, idempotency_key=""), InvalidArgumentError, "idempotency_key"),
    (lambda h: h.update("add", 1, idempotency_key="k" * 321), InvalidArgumentError, "idempotency_key"),
    (lambda h: h.update("add", 1, idempotency_key=7), InvalidArgumentError, "idempotency_key"),
    (lambda h: h.update("", 1), InvalidArgumentError, "name"),
    (lambda h: h.query("count", Unserialisable()), weft.PayloadNotSerializableError, "arg"),
    (lambda h: h.query("count", timeout="never"), InvalidArgumentError, "timeout"),
    (lambda h: h.query(None), InvalidArgumentError, "name"),
    (lambda h: weft.query("", "count"), InvalidWorkflowIdError, "id"),
    (lambda h: weft.update("bad\nid", "add", 1), InvalidWorkflowIdError, "control characters"),
    (
        lambda h: weft.start_or_signal("tests.signals", "go", float("nan"), id="x"),
        weft.PayloadNotSerializableError,
        "payload",
    ),
    (lambda h: weft.start_or_signal("tests.signals", "go", 1, id="x", signal_id=""), InvalidArgumentError, "signal_id"),
    (lambda h: weft.start_or_signal("tests.nope", "go", 1, id="x"), weft.WorkflowNotRegisteredError, "tests.nope"),
    (lambda h: weft.start_or_signal("tests.signals", "go", 1, id="x", args="ab"), InvalidArgumentError, "args"),
    (
        lambda h: weft.start_with_update("tests.msg_counter", "add", 1, id="x", timeout="x"),
        InvalidArgumentError,
        "timeout",
    ),
    (
        lambda h: weft.start_with_update("tests.msg_counter", "add", {1j}, id="x"),
        weft.PayloadNotSerializableError,
        "payload",
    ),
]


@pytest.mark.parametrize("call, error, match", BAD_INPUT)
def test_bad_input_is_refused_before_anything_is_written(call, error, match):
    handle = weft.start("tests.msg_counter", id="bad-input")
    before = table_counts()
    with pytest.raises(error, match=match):
        call(handle)
    assert table_counts() == before


# ------------------------------------------------------------------------------------ async, cleanup


def test_async_twins(engines):
    handle = weft.start("tests.msg_counter", id="async")
    engine = engines.start()
    owned(engine, handle.id)

    async def main():
        added = await handle.aupdate("add", 2, idempotency_key="a")
        counted = await handle.aquery("count")
        both = await asyncio.gather(handle.aquery("echo", 1), handle.aupdate("add", 1))
        return added, counted, both

    assert asyncio.run(main()) == (2, 2, [1, 3])


@pytest.mark.postgres
def test_query_and_update_inside_the_callers_transaction(engines):
    handle = weft.start("tests.msg_counter", id="in-atomic")
    engine = engines.start()
    owned(engine, handle.id)
    with transaction.atomic():
        assert handle.update("add", 1) == 1  # its own connection: the caller's transaction is not held
        assert handle.query("count") == 1
        with pytest.raises(weft.WorkflowNotFoundError, match="not committed yet"):
            weft.start("tests.msg_counter", id="uncommitted").query("count")


def test_message_cleanup():
    handle = weft.start("tests.msg_counter", id="cleanup")
    run_id = Workflow.objects.get(pk=handle.id).run_id
    now = db_now()
    long_ago = now - timedelta(hours=1)

    def update(status, **fields):
        return PendingUpdate.objects.create(
            workflow_id=handle.id, run_id=run_id, name="add", payload="1", status=status, **fields
        )

    old_done = update("completed", created_at=long_ago, completed_at=long_ago)
    recent_done = update("rejected", created_at=now, completed_at=now)
    abandoned = update("admitted", created_at=long_ago, deadline=long_ago)
    waiting = update("admitted", created_at=now, deadline=now + timedelta(minutes=1))
    accepted = update("accepted", created_at=long_ago)
    QueryRequest.objects.create(workflow_id=handle.id, name="q", status="answered", created_at=long_ago)
    QueryRequest.objects.create(
        workflow_id=handle.id, name="q", status="pending", created_at=long_ago, deadline=long_ago
    )
    fresh = QueryRequest.objects.create(workflow_id=handle.id, name="q", status="answered", created_at=now)
    assert messages.cleanup_messages(Engine("cleaner"), now)
    assert not PendingUpdate.objects.filter(pk=old_done.pk).exists()
    assert PendingUpdate.objects.get(pk=recent_done.pk).status == "rejected"
    assert PendingUpdate.objects.get(pk=abandoned.pk).status == "expired"  # its caller is gone
    assert PendingUpdate.objects.get(pk=waiting.pk).status == "admitted"
    assert PendingUpdate.objects.get(pk=accepted.pk).status == "accepted"  # its run is still going
    assert list(QueryRequest.objects.values_list("pk", flat=True)) == [fresh.pk]
    # A transition ends the run: it fails admitted updates itself; an accepted one (a wait_for_update
    # took it, respond() never came) is closed by the cleanup.
    handle.cancel()
    assert PendingUpdate.objects.get(pk=waiting.pk).status == "failed"
    messages.cleanup_messages(Engine("cleaner"), db_now())
    closed = PendingUpdate.objects.get(pk=accepted.pk)
    assert closed.status == "failed" and closed.error["type"] == "WorkflowTerminalError"
    assert "message-cleanup" in {task.name for task in Engine("x").periodic}
