"""The owner's in-memory view of its workflows' durable timers: a heap ordered by fire time.

Workflow-scoped timers are selected only by their owner (it created them, or loaded them when it
claimed the workflow) and deleted in its fenced commit, so a non-owner can never consume a fire the
owner needs. Entries of dropped workflows are skipped lazily, and so are entries of timers disarmed
since (a signal that came before its wait's timeout, an earlier run under the same id): each entry
comes back with the fire time it was pushed with, and fires only the timer that still has it.
"""

from __future__ import annotations

import heapq
import itertools
from datetime import datetime


class TimerHeap:
    def __init__(self) -> None:
        self._heap: list[tuple[datetime, int, str, str, int]] = []
        self._counter = itertools.count()

    def push(self, fire_at: datetime, workflow_id: str, kind: str, seq: int) -> None:
        heapq.heappush(self._heap, (fire_at, next(self._counter), workflow_id, kind, seq))

    def pop_due(self, now: datetime) -> list[tuple[str, str, int, datetime]]:
        """The entries due at ``now``: (workflow id, kind, seq, the fire time they were pushed with)."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            fire_at, _, workflow_id, kind, seq = heapq.heappop(self._heap)
            due.append((workflow_id, kind, seq, fire_at))
        return due

    def next_fire_at(self) -> datetime | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
