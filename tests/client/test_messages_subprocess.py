"""Queries and updates from the test process to workflows owned by engine subprocesses (PostgreSQL):
routing to either of two engines, idempotent retries, and an owner SIGKILLed mid-update."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time

import pytest
from django.db import connection

import weft_django as weft
from weft_django.models import AppliedUpdate, PendingUpdate, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess, pytest.mark.postgres]
FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"}


def env(**extra) -> dict[str, str]:
    return {"WEFT_TEST_OVERRIDES": json.dumps({**FAST, **extra})}


def holder(workflow_id: str) -> str | None:
    return WorkflowClaim.objects.filter(pk=workflow_id).values_list("engine_id", flat=True).first()


def held(workflow_ids: list[str]) -> dict[str, str]:
    return dict(
        WorkflowClaim.objects.filter(pk__in=workflow_ids, engine_id__isnull=False).values_list(
            "workflow_id", "engine_id"
        )
    )


def test_queries_and_updates_reach_workflows_owned_by_either_engine(weft_engines):
    # The split is made, not hoped for: engine-a (claims valid 30 s) is frozen while engine-b picks up
    # the second batch, so under load engine-a cannot win every claim race.
    steady = env(CLAIM_BATCH_SIZE=1, WORKFLOW_CLAIM_TTL="30s", WORKFLOW_CLAIM_RENEW_INTERVAL="5s")
    first = [weft.start("tests.msg_counter", kwargs={"target": 100}, id=f"two-a-{i}").id for i in range(3)]
    engine_a = weft_engines("engine-a", env=steady)
    wait_for(lambda: len(held(first)) == 3, timeout=30, message="engine-a to claim the first three")
    engine_a.freeze()
    try:
        weft_engines("engine-b", env=steady)
        second = [weft.start("tests.msg_counter", kwargs={"target": 100}, id=f"two-b-{i}").id for i in range(4)]
        wait_for(lambda: len(held(second)) == 4, timeout=20, message="engine-b to claim the second four")
    finally:
        engine_a.thaw()
    ids = first + second
    owners = held(ids)
    assert owners == {**dict.fromkeys(first, "engine-a"), **dict.fromkeys(second, "engine-b")}, owners
    for n, workflow_id in enumerate(ids, start=1):
        handle = weft.get_handle(workflow_id)
        assert handle.update("add", n, timeout="20s") == n
        assert handle.update("add", n, idempotency_key="once", timeout="20s") == 2 * n
        assert handle.update("add", n, idempotency_key="once", timeout="20s") == 2 * n  # stored, applied once
        assert handle.query("count", timeout="20s") == 2 * n
        assert handle.query("echo", workflow_id, timeout="20s") == workflow_id
        with pytest.raises(weft.UpdateValidationError):
            handle.update("add", "many", timeout="20s")
        with pytest.raises(weft.QueryNotFoundError):
            handle.query("missing", timeout="20s")
        assert holder(workflow_id) == owners[workflow_id]  # answered where it lives, not moved
    assert AppliedUpdate.objects.count() == 2 * len(ids)


def test_concurrent_idempotent_retries_from_many_threads_apply_once(weft_engines):
    handle = weft.start("tests.msg_counter", kwargs={"target": 100}, id="idem-threads")
    weft_engines("engine-a", env=env())
    weft_engines("engine-b", env=env())
    wait_for(lambda: holder(handle.id), timeout=30)
    results: list = []

    def send() -> None:
        try:
            results.append(handle.update("add", 3, idempotency_key="same", timeout="30s"))
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [3] * 8
    assert handle.query("calls", timeout="20s") == 1
    assert PendingUpdate.objects.count() == 1 and AppliedUpdate.objects.count() == 1


def slow_update(handle, marker: str, timeout: str, outcome: list) -> threading.Thread:
    def send() -> None:
        try:
            payload = {"amount": 5, "marker": marker, "sleep": 3}
            outcome.append(handle.update("slow_add", payload, timeout=timeout))
        except Exception as exc:
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def marker_lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return handle.read().split()


def test_owner_sigkilled_mid_update_is_answered_by_the_engine_that_takes_over(weft_engines):
    handle = weft.start("tests.msg_counter", kwargs={"target": 100}, id="kill-mid-update")
    victim = weft_engines("victim", env=env())
    wait_for(lambda: holder(handle.id) == "victim", timeout=30)
    marker = tempfile.mktemp(prefix="weft-slow-add-")
    outcome: list = []
    thread = slow_update(handle, marker, "60s", outcome)
    wait_for(lambda: marker_lines(marker), timeout=30, message="the handler to start")
    victim.kill()  # in the middle of the handler: its transaction (with the row lock) dies with it
    victim.wait()
    assert PendingUpdate.objects.get().status == "admitted"
    weft_engines("survivor", env=env())
    thread.join(timeout=90)
    assert outcome == [5], outcome
    assert holder(handle.id) == "survivor"
    assert len(marker_lines(marker)) == 2  # run in memory by both engines ...
    assert AppliedUpdate.objects.count() == 1  # ... applied durably once
    assert handle.query("count", timeout="20s") == 5 and handle.query("calls", timeout="20s") == 1
    os.unlink(marker)


def test_owner_sigkilled_mid_update_times_out_cleanly_and_is_never_applied(weft_engines):
    handle = weft.start("tests.msg_counter", kwargs={"target": 100}, id="kill-and-expire")
    victim = weft_engines("victim", env=env())
    wait_for(lambda: holder(handle.id) == "victim", timeout=30)
    marker = tempfile.mktemp(prefix="weft-slow-add-")
    outcome: list = []
    thread = slow_update(handle, marker, "10s", outcome)  # long enough for a loaded engine to start the handler
    wait_for(lambda: marker_lines(marker), timeout=30, message="the handler to start")
    victim.kill()
    victim.wait()
    thread.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], weft.UpdateTimeoutError), outcome
    assert "will never be applied" in str(outcome[0])
    assert PendingUpdate.objects.get().status == "expired"
    weft_engines("survivor", env=env())
    wait_for(lambda: holder(handle.id) == "survivor", timeout=30)
    assert handle.query("count", timeout="20s") == 0  # the expired update was not applied by the new owner
    time.sleep(0.5)
    assert len(marker_lines(marker)) == 1 and not AppliedUpdate.objects.exists()
    os.unlink(marker)


def test_a_query_follows_the_workflow_to_the_engine_that_takes_over(weft_engines):
    handle = weft.start("tests.msg_counter", kwargs={"target": 100}, id="query-follows")
    victim = weft_engines("victim", env=env())
    wait_for(lambda: holder(handle.id) == "victim", timeout=30)
    assert handle.update("add", 2, timeout="20s") == 2
    victim.freeze()  # alive but silent: its queries go unanswered and its claim lapses
    try:
        weft_engines("survivor", env=env())
        assert handle.query("count", timeout="30s") == 2  # re-routed once the survivor holds it (state replayed)
        assert holder(handle.id) == "survivor"
    finally:
        victim.kill()
        victim.wait()
    with pytest.raises(weft.QueryTimeoutError, match="no engine holds it|did not answer"):
        handle.suspend()
        handle.query("count", timeout="500ms")
