"""What message handlers may change: a forked run's respond() must not answer the source's update;
query handlers and update validators change nothing durable (set_attributes and respond() raise
there); an update to a suspended run says the run is suspended when it expires."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import weft_django as weft
from weft_django.models import PendingUpdate, Step
from weft_django.testing import owns, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.rev11.take_then_wait")
def take_then_wait(ctx: weft.WorkflowContext):  # type: ignore[no-untyped-def]
    payload, respond = yield ctx.wait_for_update("approve")  # step 0
    yield ctx.wait_for_signal("go")  # step 1: the answer comes after it
    respond({"answered_by": ctx.workflow_id})
    return payload


def test_a_forks_respond_does_not_answer_the_sources_update(weft_engine: Any) -> None:
    source = weft.start("tests.rev11.take_then_wait", id="rev11-src")
    owns(weft_engine, source.id)
    outcome: list[Any] = []

    def ask() -> None:
        try:
            outcome.append(source.update("approve", {"n": 1}, timeout="30s"))
        except Exception as exc:  # reported by the assertions below
            outcome.append(exc)
        finally:
            from django.db import connections

            connections.close_all()

    caller = threading.Thread(target=ask)
    caller.start()
    wait_for(lambda: PendingUpdate.objects.filter(workflow_id=source.id, status="accepted").exists())
    wait_for(lambda: Step.objects.filter(workflow_id=source.id, seq=0).exists())
    fork = weft.fork(source.id, from_step=1, new_id="rev11-fork")
    owns(weft_engine, fork.id)
    fork.signal("go")
    assert fork.result(timeout=10) == {"n": 1}
    row = PendingUpdate.objects.get(workflow_id=source.id)
    assert row.status == "accepted", f"the fork answered the source's update: {row.status} {row.result}"
    source.signal("go")
    caller.join(30)
    assert outcome == [{"answered_by": source.id}]


@weft.workflow(name="tests.rev11.noted", attributes={"note": str})
def noted(ctx: weft.WorkflowContext):  # type: ignore[no-untyped-def]
    state = {"n": 0}

    def validate(payload: Any) -> Any:
        ctx.set_attributes(note="from the validator")  # not allowed: a validator changes nothing
        return "refused"

    def peek() -> Any:
        ctx.set_attributes(note="from the query")  # not allowed: a query changes nothing
        return state["n"]

    def add(payload: Any) -> Any:
        state["n"] += payload
        return state["n"]

    ctx.on_update("refused", add, validator=validate)
    ctx.on_update("add", add)
    ctx.on_query("peek", peek)
    yield ctx.wait_for_signal("stop")
    return state["n"]


def test_a_validator_that_sets_attributes_changes_nothing(weft_engine: Any) -> None:
    from weft_django.models import WorkflowAttribute

    handle = weft.start("tests.rev11.noted", id="rev11-validator")
    owns(weft_engine, handle.id)
    with pytest.raises(weft.UpdateFailedError, match="update validator"):
        handle.update("refused", 1, timeout="10s")
    assert handle.update("add", 2, timeout="10s") == 2  # a later commit of the run
    stored = list(WorkflowAttribute.objects.filter(workflow_id=handle.id).values_list("str_value", flat=True))
    assert stored == [], "the validator's set_attributes was recorded"


def test_a_query_that_sets_attributes_changes_nothing(weft_engine: Any) -> None:
    from weft_django.models import WorkflowAttribute

    handle = weft.start("tests.rev11.noted", id="rev11-query")
    owns(weft_engine, handle.id)
    with pytest.raises(weft.QueryFailedError, match="query"):
        handle.query("peek", timeout="10s")
    assert handle.update("add", 2, timeout="10s") == 2  # a later commit of the run
    stored = list(WorkflowAttribute.objects.filter(workflow_id=handle.id).values_list("str_value", flat=True))
    assert stored == [], "the query's set_attributes was recorded"
    handle.signal("stop")
    assert handle.result(timeout=10) == 2


def test_an_update_to_a_suspended_run_says_it_is_suspended(weft_engine: Any) -> None:
    handle = weft.start("tests.rev11.noted", id="rev11-paused")
    owns(weft_engine, handle.id)
    handle.suspend()
    with pytest.raises(weft.UpdateTimeoutError) as caught:
        handle.update("add", 2, timeout="1s")
    assert "it is suspended" in str(caught.value), str(caught.value)
    assert PendingUpdate.objects.get(workflow_id=handle.id).status == "expired"
    handle.resume()
    owns(weft_engine, handle.id)
    assert handle.update("add", 3, timeout="10s") == 3  # the expired one was never applied


@weft.workflow(name="tests.rev11.answer_later")
def answer_later(ctx: weft.WorkflowContext):  # type: ignore[no-untyped-def]
    held: dict[str, Any] = {}
    ctx.on_query("answer_now", lambda: held["respond"]("from the query"))  # not allowed: a query changes nothing
    payload, held["respond"] = yield ctx.wait_for_update("approve")
    yield ctx.wait_for_signal("go")
    held["respond"]("from the workflow")
    return payload


def test_a_query_cannot_answer_an_update(weft_engine: Any) -> None:
    handle = weft.start("tests.rev11.answer_later", id="rev11-respond")
    owns(weft_engine, handle.id)
    outcome: list[Any] = []

    def ask() -> None:
        try:
            outcome.append(handle.update("approve", 1, timeout="30s"))
        except Exception as exc:  # reported by the assertion below
            outcome.append(exc)
        finally:
            from django.db import connections

            connections.close_all()

    caller = threading.Thread(target=ask)
    caller.start()
    wait_for(lambda: PendingUpdate.objects.filter(workflow_id=handle.id, status="accepted").exists())
    with pytest.raises(weft.QueryFailedError, match="query handler"):
        handle.query("answer_now", timeout="10s")
    handle.signal("go")
    caller.join(30)
    assert outcome == ["from the workflow"]
