"""Signals and updates racing a cancel, and each other (PostgreSQL: threads on their own connections,
released together by a barrier; no engine unless said).

signal() and the admission of an update take no lock on the run: a cancel committing around them is
a real interleaving. Whichever comes first, a round must end with only typed errors reaching the
caller (WorkflowTerminalError, UpdateTimeoutError), no message acknowledged and then left open on an
ended run, and one row per signal_id or idempotency key: nothing stored twice, nothing lost.
"""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.races import alternate, errors, race
from weft_django import client
from weft_django.engine import messages
from weft_django.engine.engine import Engine
from weft_django.models import BufferedSignal, PendingUpdate, Workflow
from weft_django.store.clock import db_now

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROUNDS = 10


@pytest.fixture(autouse=True)
def _close_waits():
    """update() waits on weft-wait threads that keep their connections: closed before the next test
    (and before the test database is dropped)."""
    yield
    client.close_connections()


def test_a_signal_racing_a_cancel_is_refused_or_ends_dropped():
    seen = set()
    for round_ in range(ROUNDS):
        handle = weft.start("tests.signals", id=f"sc-{round_}")
        sent, cancelled = race(
            lambda h=handle, n=round_: weft.signal(h.id, "go", n, signal_id="once"),
            lambda h=handle: weft.cancel(h.id, reason="race"),
            delays=alternate(round_, 0.05),
        )
        assert cancelled is None, cancelled
        assert Workflow.objects.get(pk=handle.id).status == "cancelled"
        rows = list(BufferedSignal.objects.filter(workflow_id=handle.id).values_list("state", flat=True))
        if isinstance(sent, weft.WorkflowTerminalError):
            seen.add("cancel first: refused")
            assert rows == []
            continue
        assert sent is None, sent
        assert len(rows) == 1, rows  # acknowledged: stored once
        seen.add(f"signal first: {rows[0]}")
        # A row written past the cancel's drop statement is left buffered; the message cleanup drops it.
        messages.cleanup_messages(Engine(f"sc-cleanup-{round_}"), db_now())
        assert BufferedSignal.objects.get(workflow_id=handle.id).state == "dropped"
    print("signal vs cancel:", sorted(seen))


def test_an_update_racing_a_cancel_ends_in_a_terminal_error_not_a_wait():
    """Admitted before the cancel (its mailbox closed fails it), admitted past the cancel's close
    (await_update finds the run ended and fails it), or refused: a WorkflowTerminalError each time,
    and no update left admitted on the cancelled run."""
    seen = set()
    for round_ in range(ROUNDS):
        handle = weft.start("tests.msg_counter", kwargs={"target": 100}, id=f"uc-{round_}")
        updated, cancelled = race(
            lambda h=handle: h.update("add", 1, idempotency_key="k", timeout="20s"),
            lambda h=handle: weft.cancel(h.id, reason="race"),
            delays=alternate(round_, 0.05),
        )
        assert cancelled is None, cancelled
        assert isinstance(updated, weft.WorkflowTerminalError), updated
        rows = list(PendingUpdate.objects.filter(workflow_id=handle.id).values_list("status", flat=True))
        assert rows in ([], ["failed"]), rows
        seen.add("refused" if not rows else "admitted, then failed")
    print("update vs cancel:", sorted(seen))


def test_two_signals_with_one_signal_id_store_one_row():
    for round_ in range(ROUNDS):
        handle = weft.start("tests.signals", id=f"ss-{round_}")
        outcomes = race(
            lambda h=handle: weft.signal(h.id, "go", "a", signal_id="same"),
            lambda h=handle: weft.signal(h.id, "go", "b", signal_id="same"),
        )
        assert outcomes == [None, None], outcomes
        assert BufferedSignal.objects.filter(workflow_id=handle.id).count() == 1


def test_two_updates_with_one_key_admit_one_and_a_racing_retry_of_it_readmits_it_once():
    """No engine: both callers wait on the same admitted update and time out (typed); then two
    retries with the key race to admit the expired update again: still one row, admitted once."""
    handle = weft.start("tests.msg_counter", kwargs={"target": 100}, id="uk")
    for attempt in range(2):
        outcomes = race(
            lambda: handle.update("add", 1, idempotency_key="same", timeout="1s"),
            lambda: handle.update("add", 1, idempotency_key="same", timeout="1s"),
        )
        assert all(isinstance(o, weft.UpdateTimeoutError) for o in outcomes), (attempt, outcomes)
        assert list(PendingUpdate.objects.filter(workflow_id="uk").values_list("status", flat=True)) == ["expired"]


def test_two_start_or_signal_calls_start_one_run_and_deliver_both_signals():
    for round_ in range(ROUNDS):
        workflow_id = f"sos-{round_}"
        outcomes = race(
            lambda w=workflow_id: weft.start_or_signal("tests.signals", "go", 1, id=w, signal_id="a"),
            lambda w=workflow_id: weft.start_or_signal("tests.signals", "go", 2, id=w, signal_id="b"),
        )
        assert errors(outcomes) == [], outcomes
        assert sorted(kind for _, kind in outcomes) == ["signalled", "started"], outcomes
        assert Workflow.objects.filter(pk=workflow_id).count() == 1
        signals = BufferedSignal.objects.filter(workflow_id=workflow_id)
        assert sorted(signals.values_list("signal_id", "state")) == [("a", "buffered"), ("b", "buffered")]


def test_two_start_with_update_calls_with_one_key_start_one_run_and_admit_one_update():
    """No engine: both wait on the one update their key names and time out (typed)."""
    for round_ in range(4):
        workflow_id = f"swu-{round_}"

        def call(w: str = workflow_id):
            return weft.start_with_update("tests.msg_counter", "add", 1, id=w, idempotency_key="k", timeout="1s")

        outcomes = race(call, call)
        assert all(isinstance(o, weft.UpdateTimeoutError) for o in outcomes), outcomes
        assert Workflow.objects.filter(pk=workflow_id).count() == 1
        assert PendingUpdate.objects.filter(workflow_id=workflow_id).count() == 1
