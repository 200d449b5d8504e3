"""A recalled workflow is loaded only under a claim renewed right before its load (engine/residency.py,
ADR 0014). The pass that recalls an evicted workflow for a wake-up loads it at once, its claim just
renewed by the recall; a workflow the evicted-mail sweep recalled (a periodic chore, after that pass's
loads) waits in the reload set for the next pass, and a transition may move its claim meanwhile
(suspend and resume draw new epochs): that pass must renew it before loading it, as any reload."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from tests.engine.test_evicted_bookkeeping import _two_evicted
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.models import WorkflowClaim
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)
ONE_RESIDENT = {"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1}


@override_settings(WEFT=ONE_RESIDENT)
def test_a_workflow_the_sweep_recalled_is_not_loaded_at_an_epoch_a_transition_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = Engine("erf-sweep", concurrency=2)
    engine.start()
    try:
        wid = _two_evicted(engine, "erf-sweep")[0]
        epoch = engine.residency.evicted[wid]
        weft.signal(wid, "go", "back")
        engine.residency.sweep(engine, db_now())  # the evicted-mail chore: renews, leaves it to the next pass
        assert engine._reload.get(wid) == epoch
        handle = weft.get_handle(wid)
        handle.suspend()  # a new epoch, no holder
        handle.resume()  # another one, claimable by any engine
        moved = WorkflowClaim.objects.get(pk=wid)
        assert moved.epoch != epoch and moved.engine_id is None

        real, stale = engine.loader.load, []

        def checked(claimed: dict[str, int], *args: Any, **kwargs: Any) -> None:
            rows = {c.pk: (c.epoch, c.engine_id) for c in WorkflowClaim.objects.filter(pk__in=list(claimed))}
            stale.extend((w, e, rows.get(w)) for w, e in claimed.items() if rows.get(w) != (e, engine.engine_id))
            real(claimed, *args, **kwargs)

        monkeypatch.setattr(engine.loader, "load", checked)
        tick_until(engine, lambda: not engine.tick(), "a quiet engine")
        assert not stale, f"loaded at an epoch it does not hold (workflow, epoch loaded, claim row): {stale}"
    finally:
        engine.shutdown()


@override_settings(WEFT=ONE_RESIDENT)
def test_a_workflow_recalled_between_passes_is_renewed_again_before_its_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recall made anywhere but at the start of the pass that loads (a query's, engine/messages.py, made
    after that pass's early load): the next pass's early load takes only what its own recall renewed,
    so this workflow waits for the claim step, which renews it first and finds the claim moved."""
    engine = Engine("erf-between", concurrency=2)
    engine.start()
    try:
        wid = _two_evicted(engine, "erf-between")[0]
        epoch = engine.residency.evicted[wid]
        engine.residency.recall(engine, [wid])  # renewed now, loaded by a later pass
        assert engine._reload.get(wid) == epoch
        handle = weft.get_handle(wid)
        handle.suspend()
        handle.resume()
        real, loads = engine.loader.load, []

        def recorded(claimed: dict[str, int], *args: Any, **kwargs: Any) -> None:
            loads.append(dict(claimed))
            real(claimed, *args, **kwargs)

        monkeypatch.setattr(engine.loader, "load", recorded)
        tick_until(engine, lambda: not engine.tick(), "a quiet engine")
        assert all(claimed.get(wid) != epoch for claimed in loads), f"loaded at its old epoch {epoch}: {loads}"
    finally:
        engine.shutdown()
