"""Garbage collection of timers whose workflow is missing or terminal. A suspended workflow keeps its
timers: the engine that claims it after resume re-arms them at their recorded fire times.
Engine-scoped.

Terminal transitions and purges delete a run's timers in their own transaction, so this is a safety
net, and it must not cost more as sleeping timers accumulate: each pass examines the next
SWEEP_BATCH timers in primary-key order after where the previous pass stopped (an index range scan
with LIMIT) and looks their workflows up by primary key, so one pass is bounded whatever the number
of timers. A full cycle over N timers takes ceil(N / SWEEP_BATCH) passes, CYCLE_PASS_INTERVAL apart;
after a cycle ends the next starts INTERVAL later.
"""

from __future__ import annotations

import logging
from datetime import datetime

from ..store import timers
from .host import EngineHost

logger = logging.getLogger(__name__)
SWEEP_BATCH = 1000  # timers examined per pass, at most
INTERVAL = 60.0  # seconds between cycles
CYCLE_PASS_INTERVAL = 5.0  # seconds between the passes of one cycle


class OrphanedTimerSweep:
    """The chore. One instance per engine: it remembers where the current cycle stands."""

    def __init__(self) -> None:
        self.after = 0  # the last timer pk examined in this cycle; 0 = a new cycle starts

    def interval(self, engine: EngineHost) -> float:
        return CYCLE_PASS_INTERVAL if self.after else INTERVAL

    def run(self, engine: EngineHost, now: datetime) -> bool:
        using = engine.using
        window = timers.timers_after(self.after, SWEEP_BATCH, using)
        # A short window ends the cycle; the next one starts from the first timer again.
        self.after = window[-1][0] if len(window) >= SWEEP_BATCH else 0
        if not window:
            return False
        live = timers.live_workflows({wid for _, wid in window}, using)
        doomed = [pk for pk, wid in window if wid not in live]
        # A timer another transaction holds is left (the next cycle collects it): never waited for here.
        collected = timers.delete_timers(doomed, using) if doomed else 0
        if collected:
            logger.info("collected orphaned timers count=%s engine=%s", collected, engine.engine_id)
        return bool(collected)


def collect_orphaned_timers(engine: EngineHost, now: datetime) -> bool:
    """One full cycle at once (tests, tools): every orphaned timer is gone when it returns."""
    sweep, collected = OrphanedTimerSweep(), False
    collected |= sweep.run(engine, now)
    while sweep.after:
        collected |= sweep.run(engine, now)
    return collected
