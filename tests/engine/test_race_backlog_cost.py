"""A workflow whose waits are all settled stops walking its mailbox, also when a wait was settled by
another one: a ``ctx.race`` of two signal waits, won by one, leaves the other's leaf in the pass's
``Waits`` though it waits no more.

Before the fix, ``Waits.take`` dropped such a leaf (not pending) without counting it out of the waits
left, so ``Waits`` stayed true and the pass went on through every later buffered record of the
workflow, each a lookup that found nothing: a race won by "b" with a backlog of n "a" signals behind
it walked all n in the pass that delivered "b" (4,598 lines of engine/signal_delivery.py for n = 300,
1,313 after, most of them the mailbox read's). The outcome was the same (work only, not order). The
work is counted here, not timed: the buffered records the delivery looked at (calls of
``_consume``, traced).
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.engine import signal_delivery
from weft_django.engine.engine import Engine
from weft_django.models import BufferedSignal, Workflow
from weft_django.status import SignalState

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 300


@weft.workflow(name="tests.race_backlog")
def racing(ctx: Any) -> Any:
    index, value = yield ctx.race([ctx.wait_for_signal("a"), ctx.wait_for_signal("b")])
    return [index, value]


@override_settings(WEFT={"POLL_INTERVAL": "60s"})
def test_a_race_won_stops_the_walk_of_the_losers_backlog() -> None:
    looked_at: list[str] = []  # the name of each record signal_delivery._consume was called with
    consume = signal_delivery._consume.__code__

    def calls(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is consume:
            looked_at.append(frame.f_locals["name"])

    handle = weft.start(racing, id="race-backlog")
    handle.signal("b", "won")  # buffered first: the first record of the mailbox the engine reads
    for i in range(BACKLOG):
        handle.signal("a", i)
    engine = Engine("race-backlog", concurrency=2)
    engine.start()
    try:
        done = Workflow.objects.filter(pk=handle.id, status="completed")
        assert threading.current_thread() is threading.main_thread()  # the engine's passes run here
        sys.settrace(calls)
        try:
            tick_until(engine, done.exists, f"{handle.id} completed")
        finally:
            sys.settrace(None)
        assert handle.result(timeout=5) == [1, "won"]
        consumed = BufferedSignal.objects.filter(workflow_id=handle.id, state=SignalState.CONSUMED)
        assert list(consumed.values_list("name", flat=True)) == ["b"]  # the loser's are dropped at the end
        # "b" (delivered), the first "a" (its wait lost the race: no wait is left), then no more.
        assert looked_at == ["b", "a"], f"{len(looked_at)} records looked at behind a backlog of {BACKLOG}"
    finally:
        engine.shutdown()
