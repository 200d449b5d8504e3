"""A workflow with a backlog of buffered signals consumes each in work that does not grow with the
backlog: the pass that delivers one signal does not walk the rest of the mailbox.

Before the fix, each pass went through every buffered row of the workflow (its known mailbox) to find
the one its wait takes, then rebuilt the list without it, and each ``S:`` wake-up rebuilt the set of
the ids it knew: n * n / 2 rows for a backlog of n, on the engine loop's thread. 2,000 signals sent
to one workflow that waits for them one at a time took 29.2 s to drain (9.5 s after). The work is
counted here, not timed: the lines of engine/signal_delivery.py the loop's thread runs (a trace).

PostgreSQL only: there a context knows its mailbox (its load's read, then the rows its ``S:`` wake-ups
carry) and reads it once. SQLite has no wake-ups, so each pass that looks at the workflow reads its
mailbox again, every buffered row of it: a backlog there still costs each pass a read of the rest.
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


@weft.workflow(name="tests.signal_backlog_sum")
def summing(ctx: Any, n: int) -> Any:
    total = 0
    for _ in range(n):
        total += yield ctx.wait_for_signal("add")
    return total


class _Lines:
    """Counts the lines of one module the current thread runs while installed."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.count = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != self.filename:
            return None  # no line events inside other modules' frames
        return self._line

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.count += 1
        return self._line


def delivery_lines(engine: Engine, workflow_id: str) -> int:
    """Tick ``engine`` (on this, the main, thread) until ``workflow_id`` completes; the lines of
    engine/signal_delivery.py it ran."""
    lines = _Lines(signal_delivery.__file__)
    assert threading.current_thread() is threading.main_thread()
    sys.settrace(lines)
    try:
        tick_until(
            engine,
            lambda: Workflow.objects.filter(pk=workflow_id, status="completed").exists(),
            f"{workflow_id} completed",
            timeout=120,
        )
    finally:
        sys.settrace(None)
    return lines.count


@pytest.mark.postgres
@override_settings(WEFT={"POLL_INTERVAL": "60s"})  # no maintenance pass: the wake-ups and armed waits drive it
def test_a_backlog_of_signals_is_consumed_in_work_that_does_not_grow_with_it() -> None:
    handle = weft.start(summing, args=[BACKLOG], id="signal-backlog")
    engine = Engine("signal-backlog", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned, "the workflow held")
        for _ in range(3):  # it waits for its first signal, its mailbox known
            engine.tick()
        for _ in range(BACKLOG):
            handle.signal("add", 1)
        lines = delivery_lines(engine, handle.id)
        assert handle.result(timeout=5) == BACKLOG
        assert BufferedSignal.objects.filter(workflow_id=handle.id, state=SignalState.CONSUMED).count() == BACKLOG
        per_signal = lines / BACKLOG
        message = f"{lines:,} lines of signal delivery for {BACKLOG} signals ({per_signal:.0f} each)"
        assert per_signal < 150, message
    finally:
        engine.shutdown()
