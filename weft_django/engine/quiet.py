"""Whether a pass of the loop would find nothing to do, so that it can skip even its clock read: no
wake-up, outcome, scan, deadline, timer or mailbox is due. The loop (``Engine._tick``) asks before every
pass without a wake-up; the check reads the loop's parts, never the database.
"""

from __future__ import annotations

import time
from typing import Protocol

from ..status import OwnershipMode
from .claimer import Claimer
from .executors import ActivityExecutors
from .host import EngineHost
from .messages import _state as mailbox_state
from .messages import unchecked_mailboxes
from .passclock import PassClock
from .progress import Progress
from .renewal import StoreLease
from .timers import TimerHeap


class QuietHost(EngineHost, Protocol):
    """The loop as this check sees it (``Engine``)."""

    clock: PassClock
    claimer: Claimer
    progress: Progress
    lease: StoreLease
    mode: str
    executor: ActivityExecutors
    timers: TimerHeap
    _last_maintenance: float
    _carry_retry_at: float


def quiet(engine: QuietHost, claim: bool) -> bool:
    """Whether a pass with no wake-up would find nothing to do: no outcome, no scan due, no timer or
    attempt deadline near, no mailbox to look at. Such a pass (as after every commit) skips even its
    clock read; deadlines are judged by the last database clock reading plus the local time since, and
    a reading is never carried forward more than CLOCK_REUSE (``Engine._workflow_now``).

    Args:
        engine: the loop.
        claim: the pass would claim new work (off while draining).
    """
    clock = time.monotonic()
    poll = engine.settings.poll_interval.total_seconds()
    if (
        engine.clock.reading is None
        or clock - engine._last_maintenance >= poll
        or engine.claimer.last_claim_scan == 0.0
        or engine._reload
        or engine.progress.unsettled  # a settle cascade goes on (engine/cascade.py)
        or engine.claimer.take_over_now
        or engine.wake.queries_waiting
        or engine.lease.lost
        or (engine.mode == OwnershipMode.LEASE and engine.lease.epoch is None)
        or not engine.executor.outcomes.empty()
        or engine.executor.polls  # remote outcomes are found by polling
        or (engine._carried and clock >= engine._carry_retry_at)
    ):
        return False
    if claim and engine.claimer.takeover_due(clock):
        return False
    for owned in engine.attention.in_flight(engine.owned):
        if any(task.deadline is not None and clock >= task.deadline for task in owned.inflight.values()):
            return False
    next_fire, estimate = engine.timers.next_fire_at(), engine.clock.estimate(clock)
    if next_fire is not None and estimate is not None and next_fire <= estimate:
        return False
    mailboxes = mailbox_state(engine)  # deliver_messages looks at new contexts and moved frontiers
    if unchecked_mailboxes(engine):
        return False
    for wid, seq in mailboxes.parked.items():
        parked = engine.owned.get(wid)
        if parked is None or (parked.run.frontier is not None and parked.run.frontier.seq != seq):
            return False
    return True


__all__ = ["QuietHost", "quiet"]
