"""Schedules with held-back runs (overlap="queue") whose slot is still taken do not hide the ones whose
slot freed (session 17's review finding). The schedule pass looks at no more than 100 such schedules
per pass; it took the first 100 with any held-back run, so with more than 100 blocked the others'
released slots were never seen while the first stayed blocked."""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django.store import schedules as store

pytestmark = pytest.mark.django_db(transaction=True)


def test_only_schedules_whose_slot_is_free_are_looked_at_for_release():
    for n in range(3):  # their first run is still running: the second waits, and will for a while
        handle = weft.schedule("tests.scheduled_run", id=f"held-blocked-{n}", every="1h", overlap="queue")
        handle.trigger()
        handle.trigger()
    free = weft.schedule("tests.scheduled_run", id="held-free", every="1h", overlap="queue")
    first = free.trigger()
    free.trigger()
    weft.cancel(first.id)  # its slot frees: the held-back run is to be released
    assert store.with_waiting_runs(100, "default") == ["held-free"]
    assert store.with_waiting_runs(1, "default") == ["held-free"]  # not one of the blocked, whatever the order
    # an engine of another deploy, which does not know the type, leaves them to one that does
    assert store.with_waiting_runs(100, "default", skip_types=["tests.scheduled_run"]) == []
