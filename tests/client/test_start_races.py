"""Starts that meet a concurrent change of the same workflow (found by a helper's review, session 17;
each test seen failing before its fix):

- ``start_or_signal`` on a finished run while another call replaces it: the second call signals the
  new run (it raised WorkflowAlreadyExistsError, "still running", and the signal was lost);
- ``start_with_update`` on a running run that ends before the update is admitted: a new run is
  started and takes the update (it raised WorkflowTerminalError);
- an idempotency key still names its workflow after the run it started continued as new (a second
  start with the key raised IdempotencyKeyPurgedError).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import weft_django as weft
from tests.testapp import deploy_chain  # noqa: F401 - registers tests.deploys.counter
from weft_django import transitions
from weft_django.client import starting
from weft_django.models import BufferedSignal, PendingUpdate, Workflow
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def _in_another_thread(action: Any) -> None:
    failed: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # reported below
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not failed, failed


@pytest.mark.postgres  # the other call writes while this one's transaction is open: SQLite has one writer
def test_start_or_signal_signals_the_run_another_call_started_over_the_finished_one(monkeypatch):
    weft.start("tests.signals", id="sos-race")
    Workflow.objects.filter(pk="sos-race").update(status="completed")
    real, first = transitions.lock_workflow, [True]

    def another_call_first(workflow_id: str, using: str) -> Any:
        if first:
            first.clear()
            _in_another_thread(lambda: weft.start_or_signal("tests.signals", "go", "A", id="sos-race"))
        return real(workflow_id, using)

    monkeypatch.setattr(transitions, "lock_workflow", another_call_first)
    _, outcome = weft.start_or_signal("tests.signals", "go", "B", id="sos-race")
    assert outcome == "signalled"
    run_id = Workflow.objects.get(pk="sos-race").run_id
    assert sorted(BufferedSignal.objects.filter(run_id=run_id).values_list("payload", flat=True)) == ['"A"', '"B"']


def _end_and_purge(workflow_id: str) -> None:
    weft.cancel(workflow_id, "ends and is purged before the update is admitted")
    transitions.purge(workflow_id)


@pytest.mark.postgres  # the cancel writes while this call's transaction is open: SQLite has one writer
@pytest.mark.parametrize("purged", [False, True], ids=["ended", "ended-and-purged"])
def test_start_with_update_starts_a_new_run_when_the_running_one_ends_before_the_admission(monkeypatch, purged):
    """Ended, or ended and purged (admit() then raised WorkflowNotFoundError to the caller), between the
    call's read of the running run and the admission of the update: a new run is started and takes it."""
    wid = f"swu-race-{purged}"
    weft.start("tests.msg_counter", args=[1], id=wid)
    first_run = Workflow.objects.get(pk=wid).run_id
    real, first = starting.admit, [True]

    def ended_first(*args: Any, **kwargs: Any) -> Any:
        if first:
            first.clear()
            end = _end_and_purge if purged else lambda w: weft.cancel(w, "ends before the update is admitted")
            _in_another_thread(lambda: end(wid))
        return real(*args, **kwargs)

    monkeypatch.setattr(starting, "admit", ended_first)
    with pytest.raises(weft.UpdateTimeoutError):  # no engine runs: admitted to the new run, not answered
        weft.start_with_update("tests.msg_counter", "add", 1, args=[1], id=wid, timeout="300ms")
    row = Workflow.objects.get(pk=wid)
    assert row.status == "running" and row.run_id != first_run
    assert PendingUpdate.objects.filter(run_id=row.run_id, name="add").count() == 1


def test_an_idempotency_key_names_its_workflow_after_the_run_continued_as_new():
    first = weft.start("tests.deploys.counter", args=[1, 0], idempotency_key="k-continued")
    first.signal("add", 1)
    run_until_idle()  # run n=1 continues as new (n=2) and waits
    assert Workflow.objects.get(pk=first.id).status == "running"
    again = weft.start("tests.deploys.counter", args=[1, 0], idempotency_key="k-continued")
    assert again.id == first.id
