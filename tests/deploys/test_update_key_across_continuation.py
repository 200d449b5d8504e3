"""An update's idempotency key across a continue-as-new: a repeated call must find the request its
first call admitted, wherever the continuation moved it, and get the same answer. PostgreSQL only: on
SQLite the admission's IMMEDIATE transaction holds the one write lock, so no commit can land inside it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections

import weft_django as weft
from tests.testapp import deploy_chain  # noqa: F401 - registers tests.deploys.update_chain
from weft_django import queries_and_updates
from weft_django.models import PendingUpdate
from weft_django.testing import run_until_idle, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def _in_thread(body: Any) -> None:
    """Run ``body`` on a thread of its own (its own connection) and wait for it."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            body()
        except BaseException as exc:  # pragma: no cover - reported below
            failure.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and not failure, failure


def test_a_repeated_update_key_finds_the_request_the_continuation_carried(monkeypatch):
    """The repeat read the run (the old one), then the run continued as new, carrying the first call's
    admitted request to the new run, which answered it; then the repeat looked for its key on the old
    run it had read, found nothing, and admitted a second request there. That one was never carried
    (the new run has the key) and failed with WorkflowTerminalError, while the first call with the same
    key got 42 from the running workflow. The run and its request are now read in one statement."""
    handle = weft.start("tests.deploys.update_chain", args=[0], id="key-across-cn")
    run_until_idle()
    first: list[object] = []

    def first_call() -> None:
        try:
            first.append(handle.update("bump", 21, idempotency_key="k", timeout="60s"))
        finally:
            connections.close_all()

    caller = threading.Thread(target=first_call)
    caller.start()
    wait_for(lambda: PendingUpdate.objects.filter(workflow_id=handle.id).exists(), message="admitted")
    handle.signal("next")  # run 0 continues as new on the engine's next pass; run 1 takes "bump"

    real_db_now = queries_and_updates.db_now
    armed = threading.Event()
    armed.set()

    def continue_first(using: str) -> Any:  # the engine's pass lands between the repeat's reads
        if armed.is_set():
            armed.clear()
            _in_thread(run_until_idle)
        return real_db_now(using)

    monkeypatch.setattr(queries_and_updates, "db_now", continue_first)
    second = handle.update("bump", 21, idempotency_key="k", timeout="30s")
    caller.join(timeout=60)
    assert not armed.is_set(), "the pass did not run inside the repeat's admission"
    assert first == [42]
    assert second == 42
    assert PendingUpdate.objects.filter(workflow_id=handle.id).count() == 1
    assert handle.result(timeout=10) == 21
