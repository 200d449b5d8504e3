"""A periodic chore is due on the engine's first maintenance pass, whatever its interval and however
long the machine has been up (time.monotonic() counts from boot: an hourly chore used to wait for
the first hour of uptime, and a daily one for the first day)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from weft_django.engine.periodic import PeriodicTask


def test_a_chore_that_never_ran_is_due_then_waits_its_interval():
    longer_than_uptime = time.monotonic() + 3600.0
    task = PeriodicTask("daily", lambda engine: longer_than_uptime, lambda engine, now: False)
    engine = SimpleNamespace()
    assert task.due(engine)  # type: ignore[arg-type]
    task.last_run = time.monotonic()
    assert not task.due(engine)  # type: ignore[arg-type]
