"""A workflow that was stuck once is evicted like any other once it is parked (engine/residency.py).

A run loaded with a stuck mark (its code was missing, then deployed: VersionMismatchError, retried
after its back-off) has the mark cleared by its first commit. The loaded context kept
``Owned.clear_stuck`` set after that commit, and eviction counted it as a write still waiting: such a
workflow was never evicted. After a deploy that had left many parked runs stuck, the engine loaded
them all and kept every one resident, past ``MAX_RESIDENT_WORKFLOWS``."""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from tests.engine.test_carried_signals import carried_once
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.models import Workflow
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(WEFT={"POLL_INTERVAL": "100ms", "MAX_RESIDENT_WORKFLOWS": 1})
def test_parked_workflows_that_were_stuck_are_evicted() -> None:
    ids = [weft.start(carried_once, id=f"eas-{n}").id for n in range(3)]
    runs = Workflow.objects.filter(pk__in=ids)
    version = runs.first().version
    runs.update(version="9")  # started by code this engine does not have yet
    engine = Engine("eas", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: runs.filter(stuck_error__isnull=False).count() == 3, "the three stuck")
        assert engine.residency.evictions == 0
        runs.update(version=version)  # the code is deployed: each is loaded again after its back-off
        tick_until(engine, lambda: not runs.filter(stuck_error__isnull=False).exists(), "the stuck marks cleared")
        tick_until(engine, lambda: len(engine.residency.evicted) == 2, "two of the three evicted", timeout=10)
        assert len(engine.owned) == 1
        for wid in ids:
            weft.signal(wid, "go", wid)

        def ended() -> bool:
            engine.residency.sweep(engine, db_now())  # what recalls them on SQLite (no wake-ups there)
            return runs.filter(status="completed").count() == 3

        tick_until(engine, ended, "their ends")
        assert sorted(weft.get_handle(wid).result(timeout=1) for wid in ids) == sorted(ids)
    finally:
        engine.shutdown()
