"""A workflow is not evicted while a wake-up naming it waits for the next pass (engine/residency.py).

An engine at its ``MAX_RESIDENT_WORKFLOWS`` evicts after each pass. A parked workflow that loops on a
signal (or an update) takes one and arms its next wait in the same pass, and arming the wait asks the
next pass to look at its mailbox (``Wake.look_for_signal``, ``look_at``). When that pass also loaded
another workflow (a start, a recall), the one that just took its signal was the oldest idle parked
workflow and was evicted; the next pass's look, a wake-up naming it, recalled it: its claim renewed,
its history loaded and replayed, for no mail at all (a second load per signal)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from tests.engine.test_carried_signals import carried_loop
from tests.engine.ticking import tick_until
from weft_django.codec import encode_payload
from weft_django.engine.engine import Engine
from weft_django.models import BufferedSignal, PendingUpdate, Workflow
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)
ONE_RESIDENT = {"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1}


@weft.workflow(name="tests.eol_update_loop")
def update_loop(ctx: Any) -> Any:
    while True:
        payload, respond = yield ctx.wait_for_update("next")
        respond(payload)


def _signal(wid: str) -> None:
    BufferedSignal.objects.create(
        workflow_id=wid,
        run_id=Workflow.objects.get(pk=wid).run_id,
        name="go",
        payload=encode_payload(1),
        created_at=db_now(),
    )


def _update(wid: str) -> None:
    PendingUpdate.objects.create(
        workflow_id=wid,
        run_id=Workflow.objects.get(pk=wid).run_id,
        name="next",
        payload=encode_payload(1),
        created_at=db_now(),
    )


def _taken(wid: str) -> bool:
    signals = BufferedSignal.objects.filter(workflow_id=wid, state="consumed")
    return signals.exists() or PendingUpdate.objects.filter(workflow_id=wid).exclude(status="admitted").exists()


@pytest.mark.parametrize(
    ("workflow", "send"), [(carried_loop, _signal), (update_loop, _update)], ids=["signal", "update"]
)
@override_settings(WEFT=ONE_RESIDENT)
def test_a_workflow_whose_wait_was_armed_in_this_pass_is_not_evicted_and_recalled(workflow: Any, send: Any) -> None:
    engine = Engine("eol", concurrency=2)
    engine.start()
    try:
        first = weft.start(workflow, id="eol-first").id
        tick_until(
            engine,
            lambda: first in engine.owned and engine.owned[first].armed and not engine.attention.unchecked,
            "the first workflow parked, its mailbox looked at",
        )
        for _ in range(3):  # its own look served
            engine.tick()
        # In one pass: the first takes its mail (the rows are written without a wake-up and the pass is
        # told to look: the same on SQLite, which has none), and a second workflow is claimed and loaded.
        send(first)
        engine.wake.look_at(first)
        second = weft.start(workflow, id="eol-second").id
        engine.claimer.scan_soon()
        engine.tick()
        assert _taken(first) and second in engine.owned
        # Back to its limit (at once, or a second later when that pass found none to evict) ...
        tick_until(engine, lambda: engine.residency.evictions >= 1, "an eviction")
        for _ in range(5):  # ... and what it evicted stays evicted
            engine.tick()
        assert engine.residency.recalls == 0, "a workflow was evicted and recalled with no mail for it"
    finally:
        engine.shutdown()
