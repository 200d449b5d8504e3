"""The sweep behind LISTEN for evicted workflows (engine/residency.py) recalls a workflow for mail it
has not seen, not on every sweep for mail it has (session 17's review finding).

An evicted workflow waits for one signal; a signal of another name stays buffered until the workflow
asks for it. The sweep recalled every evicted workflow with any buffered signal, so such a workflow
was loaded and replayed once per renew interval for nothing, and with many of them (a million
parked, each with an early signal it reads later) the engine spent its time reloading them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import override_settings

import weft_django as weft
from tests.engine.test_carried_signals import carried_once
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)
ONE_RESIDENT = {"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1}


def _settled(engine: Engine) -> Callable[[], bool]:
    return lambda: len(engine.residency.evicted) == 2 and not engine._reload


def _sweep(engine: Engine) -> int:
    """One sweep, then ticks until the recalled workflows are evicted again: how many it recalled."""
    before = engine.residency.recalls
    engine.residency.sweep(engine, db_now())
    recalled = engine.residency.recalls - before
    tick_until(engine, _settled(engine), "two evicted again")
    return recalled


@override_settings(WEFT=ONE_RESIDENT)
def test_an_evicted_workflow_is_recalled_for_new_mail_only() -> None:
    engine = Engine("eum", concurrency=2)
    engine.start()
    try:
        ids = [weft.start(carried_once, id=f"eum-{n}").id for n in range(3)]
        tick_until(engine, _settled(engine), "two of three evicted")
        for wid in ids:  # mail none of them waits for yet
            weft.signal(wid, "later", wid)
        tick_until(engine, _settled(engine), "the wake-ups served")
        recalls = [_sweep(engine) for _ in range(5)]
        assert recalls[-3:] == [0, 0, 0], f"recalled for mail already seen, sweep after sweep: {recalls}"

        # New mail whose wake-up is not served before the sweep: the sweep recalls its workflow.
        wid = sorted(engine.residency.evicted)[0]
        weft.signal(wid, "go", "found by the sweep")
        before = engine.residency.recalls
        engine.residency.sweep(engine, db_now())
        assert engine.residency.recalls == before + 1 and wid not in engine.residency.evicted
        tick_until(engine, lambda: weft.get_handle(wid).describe()["status"] == "completed", "its end")
        assert weft.get_handle(wid).result(timeout=1) == "found by the sweep"
    finally:
        engine.shutdown()


@override_settings(WEFT=ONE_RESIDENT)
def test_a_quiet_engine_over_its_limit_does_not_reload_its_evicted_workflows() -> None:
    """A workflow was evicted in the pass that loaded it, before its mailbox was looked at; the look
    then recalled it, and the next pass evicted it again: a reload per pass for nothing (found by the
    review of the mail marks). A workflow is evicted only once its mailbox has been looked at."""
    engine = Engine("eum-quiet", concurrency=2)
    engine.start()
    try:
        for n in range(3):
            weft.start(carried_once, id=f"eum-quiet-{n}")
        tick_until(engine, _settled(engine), "two of three evicted")
        before = engine.residency.recalls
        for _ in range(10):
            engine.tick()
        assert engine.residency.recalls == before, "evicted workflows reloaded with nothing to do"
    finally:
        engine.shutdown()
