"""A signal is never reported sent without its row (a helper's review, session 19).

``signal()`` inserts the signal for the workflow's active run in one statement, and when nothing was
inserted it looked at the workflow again: an active run there was taken for a repeated signal_id
("duplicate"), so a run started or retried between the two statements made ``signal()`` return as
if sent, with no signal stored, and the run waited for ever. Now only a signal_id already in that
run's mailbox is a duplicate; otherwise the signal is inserted again, for the run that is active now.
"""

from __future__ import annotations

from typing import Any

import pytest

import weft_django as weft
from weft_django.client import messages as client_messages
from weft_django.models import BufferedSignal
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def _start_after_the_first_insert(monkeypatch: pytest.MonkeyPatch, workflow_id: str) -> None:
    """Another process's start of ``workflow_id`` commits right after signal()'s first insert."""
    real = client_messages.mailbox.buffer_signal
    calls: list[int] = []

    def buffer_then_start(*args: Any, **kwargs: Any) -> bool:
        inserted = real(*args, **kwargs)
        if not calls:
            calls.append(1)
            weft.start("tests.signals", id=workflow_id)
        return inserted

    monkeypatch.setattr(client_messages.mailbox, "buffer_signal", buffer_then_start)


@pytest.mark.parametrize("signal_id", [None, "once"])
def test_a_signal_racing_the_start_of_its_run_is_stored_for_that_run(monkeypatch, signal_id):
    _start_after_the_first_insert(monkeypatch, "sig-race")
    weft.signal("sig-race", "go", 7, signal_id=signal_id)
    monkeypatch.undo()
    assert BufferedSignal.objects.filter(workflow_id="sig-race", name="go").count() == 1
    run_until_idle()
    assert weft.get_handle("sig-race").result(timeout=5) == 7


def test_a_repeated_signal_id_is_still_a_no_op():
    handle = weft.start("tests.signals", id="sig-repeat")
    weft.signal(handle.id, "go", 1, signal_id="same")
    weft.signal(handle.id, "go", 2, signal_id="same")
    assert list(BufferedSignal.objects.filter(workflow_id=handle.id).values_list("payload", flat=True)) == ["1"]
    run_until_idle()
    assert handle.result(timeout=5) == 1


def test_a_signal_to_an_unknown_workflow_is_refused_and_stores_nothing():
    with pytest.raises(weft.WorkflowNotFoundError):
        weft.signal("sig-nobody", "go", 1)
    assert not BufferedSignal.objects.filter(workflow_id="sig-nobody").exists()
