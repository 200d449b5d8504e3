"""Engine-scoped chores that run on their own cadence inside the loop (schedule firing, retention,
the orphaned-timer sweep). Each is engine-scoped: it never writes a workflow's state under that
workflow's fence; whatever it enables (a schedule's run, a purge) goes through transitions.py or
folds the acquire into its own transaction."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import datetime

from .host import EngineHost


@dataclasses.dataclass
class PeriodicTask:
    name: str
    interval_seconds: Callable[[EngineHost], float]
    run: Callable[[EngineHost, datetime], bool]  # returns whether it did anything
    last_run: float = 0.0

    def due(self, engine: EngineHost) -> bool:
        return time.monotonic() - self.last_run >= self.interval_seconds(engine)


def builtin_tasks() -> list[PeriodicTask]:
    """The chores every engine runs. Modules add theirs here."""
    from . import messages, sweeps
    from .retention import RetentionSweep
    from .schedules import ScheduleFiring

    schedules, retention, timer_sweep = ScheduleFiring(), RetentionSweep(), sweeps.OrphanedTimerSweep()
    return [
        PeriodicTask("timer-sweep", timer_sweep.interval, timer_sweep.run),
        PeriodicTask("schedules", schedules.interval, schedules.run),
        PeriodicTask("retention", retention.interval, retention.run),
        PeriodicTask("message-cleanup", messages.cleanup_interval, messages.cleanup_messages),
        # Evicted workflows with mail a wake-up did not announce are loaded again (engine/residency.py).
        PeriodicTask("evicted-mail", lambda e: e.residency.interval(e), lambda e, now: e.residency.sweep(e, now)),
    ]
