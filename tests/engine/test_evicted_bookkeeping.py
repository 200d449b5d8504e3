"""The engine's record of its evicted workflows (engine/residency.py) stays true when things go wrong.
A dormant claim (ADR 0014) is kept by the heartbeat and found lost only late, so a slip in this
record now costs up to ten TTLs, not one:

- a recalled workflow whose load fails (a database error) is loaded on a later pass, not forgotten
  while its claim stays held;
- a workflow claimed again at a new epoch (its old claim was lost while it was evicted) leaves the
  evicted record, so no later wake-up reloads it at the old epoch over the live one.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError
from django.test import override_settings

import weft_django as weft
from tests.engine.test_carried_signals import carried_once
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.models import WorkflowClaim
from weft_django.store.clock import db_now
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
ONE_RESIDENT = {"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1}


def _two_evicted(engine: Engine, prefix: str) -> list[str]:
    for n in range(3):
        weft.start(carried_once, id=f"{prefix}-{n}")
    tick_until(engine, lambda: len(engine.residency.evicted) == 2, "two of three evicted")
    return sorted(engine.residency.evicted)


@override_settings(WEFT=ONE_RESIDENT)
def test_a_recalled_workflow_whose_load_fails_is_loaded_on_a_later_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine("eb-load", concurrency=2)
    engine.start()
    try:
        wid = _two_evicted(engine, "eb-load")[0]
        real, calls = engine.loader.load, []

        def fails_once(*args: Any, **kwargs: Any) -> None:
            calls.append(args[0])
            if len(calls) == 1:
                raise DatabaseError("the connection dropped mid-load")
            real(*args, **kwargs)

        monkeypatch.setattr(engine.loader, "load", fails_once)
        weft.signal(wid, "go", "back")
        # Its wake-up recalls it on PostgreSQL; SQLite has none, and the sweep for evicted workflows'
        # mail recalls it (run here: with POLL_INTERVAL 60 s it would not be due within the test).
        engine.residency.sweep(engine, db_now())
        tick_until(engine, lambda: len(calls) >= 2, "a second load after the failed one")
        assert wid in calls[0] and wid in calls[1]
        tick_until(engine, lambda: weft.get_handle(wid).describe()["status"] == "completed", "the recalled run's end")
        assert weft.get_handle(wid).result(timeout=1) == "back"
    finally:
        engine.shutdown()


@override_settings(WEFT=ONE_RESIDENT)
def test_a_workflow_claimed_again_at_a_new_epoch_leaves_the_evicted_record() -> None:
    engine = Engine("eb-epoch", concurrency=2)
    engine.start()
    try:
        wid = weft.start(carried_once, id="eb-epoch-0").id
        # The record of a dormant claim this engine lost without hearing of it (found late, ADR 0014):
        # the workflow is unheld now, and this engine's next claim scan takes it at a new epoch.
        engine.residency.evicted[wid] = 1
        engine.claimer.last_claim_scan = 0.0
        tick_until(engine, lambda: wid in engine.owned, "claimed again")
        assert engine.owned[wid].epoch > 1 and wid not in engine.residency.evicted
        # A wake-up naming it must not load it again at the old epoch over the live context.
        weft.signal(wid, "go", "again")
        tick_until(engine, lambda: weft.get_handle(wid).describe()["status"] == "completed", "its end")
        assert weft.get_handle(wid).result(timeout=1) == "again"
        assert engine.refused_commits == 0
        assert WorkflowClaim.objects.get(pk=wid).engine_id is None
    finally:
        engine.shutdown()


@pytest.mark.postgres
@override_settings(WEFT=ONE_RESIDENT)
def test_the_pass_that_recalls_an_evicted_workflow_delivers_the_signal_that_woke_it() -> None:
    """The recall renews the claim, then the same pass loads the workflow before it delivers signals: the
    signal carried in the wake-up is consumed by that pass (before, the load came after the delivery,
    and a second pass read the mailbox again: one pass and a transaction more per evicted wake-up,
    docs/benchmarks.md session 27)."""
    engine = Engine("eb-one-pass", concurrency=2)
    engine.start()
    try:
        wid = _two_evicted(engine, "eb-one-pass")[0]
        tick_until(engine, lambda: not engine.tick(), "a quiet engine")
        weft.signal(wid, "go", "woken")
        wait_for(lambda: wid in engine.wake.carried, timeout=30, message="the signal's wake-up")
        engine.tick()
        assert weft.get_handle(wid).describe()["status"] == "completed", "the recalling pass left the signal"
        assert weft.get_handle(wid).result(timeout=1) == "woken"
    finally:
        engine.shutdown()
