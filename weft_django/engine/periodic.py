"""Engine-scoped chores that run on their own cadence inside the loop (schedule firing, retention,
the orphaned-timer sweep, the message cleanup). Each is engine-scoped: it never writes a workflow's
state under that workflow's fence; whatever it enables (a schedule's run, a purge) goes through
transitions.py or folds the acquire into its own transaction. A chore that fails is logged and
contained (``PeriodicTask.run_contained``): the other chores and the pass go on."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from datetime import datetime

from django.db import connections

from .host import EngineHost

logger = logging.getLogger("weft_django.engine.engine")


@dataclasses.dataclass
class PeriodicTask:
    name: str
    interval_seconds: Callable[[EngineHost], float]
    run: Callable[[EngineHost, datetime], bool]  # returns whether it did anything
    last_run: float | None = None  # time.monotonic() of its last run; None: never (due at once)

    def due(self, engine: EngineHost) -> bool:
        """Whether it runs on this pass: never run yet, or its interval has passed since it last ran
        (``time.monotonic()`` counts from the machine's boot: a chore of an hour must not wait for
        the first hour of uptime)."""
        return self.last_run is None or time.monotonic() - self.last_run >= self.interval_seconds(engine)

    def run_contained(self, engine: EngineHost, now: datetime) -> bool:
        """Run the chore once; a chore that fails is logged with its exception and counts as having
        done nothing, so the other chores and the rest of the engine's pass go on (no workflow is
        reloaded: a chore writes no workflow's state). It runs again when next due. A database error
        that left the connection unusable closes it (the next query reconnects)."""
        try:
            return self.run(engine, now)
        except Exception:
            logger.exception("periodic chore failed chore=%s engine=%s", self.name, engine.engine_id)
            connection = connections[engine.using]
            if not connection.in_atomic_block:
                connection.close_if_unusable_or_obsolete()
            return False


class Chores:
    """When a pass runs the chores that are due: in order, each contained, stopping for a wake-up that
    arrived during the pass (it is served first, by the next pass), unless they have been held back for
    ``patience`` seconds already: a stream of wake-ups must not keep the schedules, the message cleanup
    or the evicted-mail sweep from running while every pass is busy."""

    def __init__(self) -> None:
        self.held_back_since: float | None = None  # time.monotonic() of the first pass that held them back

    def run_due(
        self,
        engine: EngineHost,
        tasks: list[PeriodicTask],
        now: datetime,
        woken: Callable[[], bool],
        patience: float,
    ) -> bool:
        """Run the chores of ``tasks`` that are due. Returns whether any did anything.

        Args:
            engine: the loop; ``now``: the pass's workflow time.
            woken: whether a wake-up arrived since the pass began.
            patience: seconds the chores may be held back by wake-ups before they run regardless.
        """
        busy = False
        for task in tasks:
            if woken():
                clock = time.monotonic()
                if self.held_back_since is None:
                    self.held_back_since = clock
                if clock - self.held_back_since < patience:
                    return busy  # the rest stay due for the next pass
            if task.due(engine):
                task.last_run = time.monotonic()
                busy |= task.run_contained(engine, now)
        self.held_back_since = None
        return busy


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
