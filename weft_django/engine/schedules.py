"""Schedule firing: an engine-scoped chore every POLL_INTERVAL (see weft_django/schedules.py).

Any engine takes a due schedule row (``next_fire_at <= now``, not paused) with SKIP LOCKED (on SQLite
the one-writer transaction does the same), starts the occurrence's run under the overlap policy and
advances the row in that one transaction, so each occurrence starts at most one run whichever
engines run. Its run id is derived from the nominal time: a row somebody else already created under
that id (an older run of a re-created schedule) is kept, not duplicated.

Missed occurrences: with ``backfill=False`` only the latest due occurrence fires, and only if it is
at most MISFIRE_GRACE late; every other due occurrence (engines were down, or a pass came late) is
counted in ``missed_fire_count`` and logged. With ``backfill=True`` every due occurrence fires, in
order, at most BACKFILL_PER_PASS per schedule and pass (the rest on the following passes).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import InterfaceError, OperationalError

from ..exceptions import UnusableScheduleError
from ..models import Schedule
from ..registry import WorkflowDefinition, registry
from ..schedules import (
    QUEUED,
    STARTED,
    Timing,
    active_runs,
    cancel_waiting,
    check_timing_readable,
    fire,
    occurrence_id,
    release_waiting,
    retime,
)
from ..store import schedules as store
from ..store.sessions import lock_wait_bounded, lock_wait_ended
from .host import EngineHost

logger = logging.getLogger(__name__)

MISFIRE_GRACE = timedelta(seconds=60)  # how late the latest occurrence may fire when backfill is off
SCHEDULES_PER_PASS = 100
BACKFILL_PER_PASS = 100  # catch-up runs per schedule and pass
STEPS_PER_PASS = 1000  # occurrences looked at per schedule and pass (counting missed cron fires)
MAX_MISSED_COUNT = 2**31 - 1  # missed_fire_count is an integer column: the count stays at its maximum
FAILED_BACKOFF = 60.0  # seconds before this engine retries a schedule whose firing raised
HELD_BACKOFF = (0.5, 8.0)  # seconds before a firing that met a held row is tried again, doubling to the second
# Database errors that pass (a lock or statement timeout, a deadlock, a serialization failure, a lost
# connection): retried on the next pass. Any other error, DataError and IntegrityError included (a
# value of the row that the database refuses), is the schedule's own: backed off FAILED_BACKOFF.
TRANSIENT_ERRORS = (OperationalError, InterfaceError)


class ScheduleFiring:
    """The chore. One instance per engine: it remembers the workflow types this engine does not have
    (their schedules are left to engines that do) and backs off from schedules that failed, so neither
    can crowd the others out of a pass."""

    def __init__(self) -> None:
        self._unknown_types: set[str] = set()
        self._failed: dict[str, float] = {}  # schedule id -> monotonic time of its next attempt
        # schedule id -> (monotonic time of its next attempt, its back-off): its firing met a row held elsewhere
        self._held: dict[str, tuple[float, float]] = {}

    def interval(self, engine: EngineHost) -> float:
        return engine.settings.poll_interval.total_seconds()

    def run(self, engine: EngineHost, now: datetime) -> bool:
        """One pass at workflow time ``now`` (the engine tick's). Returns whether anything happened."""
        using = engine.using
        clock = time.monotonic()
        self._failed = {key: retry_at for key, retry_at in self._failed.items() if retry_at > clock}
        waiting = {key for key, (retry_at, _) in self._held.items() if retry_at > clock}
        due = store.due_schedules(
            now,
            skip_types=self._unknown_types,
            skip_ids=[*self._failed, *waiting],
            limit=SCHEDULES_PER_PASS,
            using=using,
        )
        busy = False
        for schedule_id in dict.fromkeys([*_with_waiting_runs(using, self._unknown_types), *due]):
            if schedule_id in waiting:  # backed off: a row its firing writes was held elsewhere
                continue
            try:
                busy |= self._process(schedule_id, now, using)
                self._held.pop(schedule_id, None)
            except TRANSIENT_ERRORS as exc:
                if lock_wait_ended(exc):
                    self._back_off_held(schedule_id)
                    continue
                logger.warning("schedule pass failed schedule=%s error=%s; retried next pass", schedule_id, exc)
            except UnusableScheduleError as exc:
                logger.warning("schedule cannot be fired: %s; retried in %ss", exc, FAILED_BACKOFF)
                self._failed[schedule_id] = time.monotonic() + FAILED_BACKOFF
            except Exception:  # DataError, IntegrityError: the row's own fault, like any other exception
                logger.exception("schedule could not be fired schedule=%s; retried in %ss", schedule_id, FAILED_BACKOFF)
                self._failed[schedule_id] = time.monotonic() + FAILED_BACKOFF
        return busy

    def _back_off_held(self, schedule_id: str) -> None:
        """Its firing met a row another transaction holds (a user's open transaction: the claim, row or
        mail of a run it cancels or releases): tried again after a back-off doubling up to HELD_BACKOFF[1].
        Logged once per stretch of back-offs, not on every pass."""
        backoff = min(self._held.get(schedule_id, (0.0, HELD_BACKOFF[0] / 2))[1] * 2, HELD_BACKOFF[1])
        if schedule_id not in self._held:
            logger.warning(
                "schedule not fired yet schedule=%s: a row it writes is locked by another transaction "
                "(a user's open transaction?); tried again with back-off",
                schedule_id,
            )
        self._held[schedule_id] = (time.monotonic() + backoff, backoff)

    def _process(self, schedule_id: str, now: datetime, using: str) -> bool:
        # A row a user's open transaction holds (a run to cancel or release) ends the pass's wait for it
        # after COMMIT_LOCK_WAIT_MS, not the session's lock_timeout: the engine's loop runs this.
        with lock_wait_bounded(using):
            row = store.lock_schedule(schedule_id, using, skip_locked=True)
            if row is None:
                if not store.schedule_exists(schedule_id, using):  # deleted, not locked
                    cancel_waiting(schedule_id, f'schedule "{schedule_id}" was deleted', using)
                return False
            released = release_waiting(active_runs(schedule_id, using), now, using)
            if released is not None:
                logger.info("queued run released schedule=%s workflow=%s", schedule_id, released)
            if not row.paused:
                check_timing_readable(row)  # a next fire time Python cannot hold: backed off, with its reason
            if row.paused or row.next_fire_at is None or row.next_fire_at > now:
                return released is not None
            if schedule_id in self._failed:  # backed off, here for its queued run: released, not fired
                return released is not None
            definition = registry.latest.get(row.workflow_type)
            if definition is None:
                if row.workflow_type not in self._unknown_types:
                    self._unknown_types.add(row.workflow_type)
                    logger.warning(
                        "schedule not fired here: workflow type is not registered in this engine "
                        "schedule=%s workflow_type=%s",
                        schedule_id,
                        row.workflow_type,
                    )
                return released is not None
            self._fire_due(row, now, using, definition)
            return True

    def _fire_due(self, row: Schedule, now: datetime, using: str, definition: WorkflowDefinition) -> None:
        if row.next_nominal_at is None or row.next_fire_at is None:  # a row written without the API
            retime(row, now)
            store.save_schedule(row, ["next_nominal_at", "next_fire_at"], using)
            return
        timing = Timing.of(row)
        nominal, fire_at = row.next_nominal_at, row.next_fire_at
        missed = 0
        if not row.backfill and timing.every is not None:
            # Occurrences that even with the largest jitter are later than the grace: count, don't walk.
            horizon = now - MISFIRE_GRACE - timedelta(milliseconds=timing.jitter_ms)
            if nominal <= horizon:
                period = timedelta(seconds=timing.every)
                skipped = (horizon - nominal) // period + 1
                missed += skipped
                nominal += skipped * period
                fire_at = timing.fire_at(nominal)
        following = timing.following(nominal)
        fired = steps = 0
        outcomes: list[tuple[str, str]] = []
        while fire_at <= now and steps < STEPS_PER_PASS and fired < BACKFILL_PER_PASS:
            steps += 1
            upcoming = next(following)
            upcoming_fire_at = timing.fire_at(upcoming)
            latest = upcoming_fire_at > now
            # Less than a period late, it fires even with the next one due as well: a jittered occurrence
            # comes due just before the next one's nominal time, and a live engine's pass may see both.
            # Only a pass more than a period late coalesces the occurrences it finds (docs/schedules.md).
            in_time = now - fire_at < upcoming - nominal
            if row.backfill or ((latest or in_time) and now - fire_at <= MISFIRE_GRACE):
                workflow_id = occurrence_id(row.id, nominal)
                outcome = fire(row, workflow_id, definition, now, using)
                outcomes.append((workflow_id, outcome))
                fired += 1
                if outcome in (STARTED, QUEUED):
                    row.last_fired_at = now
            else:
                missed += 1
            nominal, fire_at = upcoming, upcoming_fire_at
        row.next_nominal_at, row.next_fire_at = nominal, fire_at
        row.missed_fire_count = min(row.missed_fire_count + missed, MAX_MISSED_COUNT)
        store.save_schedule(row, ["next_nominal_at", "next_fire_at", "last_fired_at", "missed_fire_count"], using)
        for workflow_id, outcome in outcomes:
            logger.info("schedule fired schedule=%s workflow=%s outcome=%s", row.id, workflow_id, outcome)
        if missed:
            logger.warning(
                "schedule missed occurrences schedule=%s missed=%s total_missed=%s backfill=off next_fire_at=%s",
                row.id,
                missed,
                row.missed_fire_count,
                fire_at.isoformat(),
            )


def _with_waiting_runs(using: str, unknown_types: set[str]) -> list[str]:
    """Schedules with a run queued by overlap="queue" and not released yet, whose slot has freed."""
    return store.with_waiting_runs(SCHEDULES_PER_PASS, using, skip_types=unknown_types)
