"""``start_with_update`` starts the run when it is absent or finished. A running run that ended and
was purged between the call's read of it and the update's admission made the call raise
WorkflowNotFoundError (``start_or_signal`` starts a new run then, as the run is absent)."""

from __future__ import annotations

from typing import Any

import pytest

import weft_django as weft
from tests.client.test_start_races import _in_another_thread
from weft_django import transitions
from weft_django.client import starting
from weft_django.models import PendingUpdate, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


def _end_and_purge(workflow_id: str) -> None:
    weft.cancel(workflow_id, "ends and is purged before the update is admitted")
    transitions.purge(workflow_id)


@pytest.mark.postgres  # the purge writes while this call's transaction is open: SQLite has one writer
def test_start_with_update_starts_a_run_when_the_running_one_is_purged_before_the_admission(monkeypatch):
    weft.start("tests.msg_counter", args=[1], id="swu-purged")
    first_run = Workflow.objects.get(pk="swu-purged").run_id
    real, first = starting.admit, [True]

    def purged_first(*args: Any, **kwargs: Any) -> Any:
        if first:
            first.clear()
            _in_another_thread(lambda: _end_and_purge("swu-purged"))
        return real(*args, **kwargs)

    monkeypatch.setattr(starting, "admit", purged_first)
    with pytest.raises(weft.UpdateTimeoutError):  # no engine runs: admitted to the new run, not answered
        weft.start_with_update("tests.msg_counter", "add", 1, args=[1], id="swu-purged", timeout="300ms")
    row = Workflow.objects.get(pk="swu-purged")
    assert row.status == "running" and row.run_id != first_run
    assert PendingUpdate.objects.filter(run_id=row.run_id, name="add").count() == 1
