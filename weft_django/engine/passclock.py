"""Workflow time for the engine's passes: the database clock, read at most once per reuse window
while passes follow each other where the database has its own clock (PostgreSQL), and estimated in
between from the last reading plus the monotonic time since."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from ..store.backend import backend
from ..store.clock import db_now, offset_generation

ESTIMATE_JITTER = timedelta(milliseconds=5)  # how far a fresh reading may fall behind the last estimate


class PassClock:
    """The loop's clock.

    Args:
        using: the connection alias whose clock is the workflows' clock.
    """

    def __init__(self, using: str) -> None:
        self.using = using
        self.reading: tuple[datetime, float] | None = None  # the last db_now() and time.monotonic() then
        self._generation = -1  # clock.offset_generation() at that reading
        self._last_now = datetime.min.replace(tzinfo=UTC)  # the latest workflow time a pass was given

    def now(self, *, fresh: bool, reuse: float) -> datetime:
        """Workflow time for this pass. Within ``reuse`` seconds of the last reading (and where the
        database has its own clock) the last reading plus the monotonic time since, as the quiet-pass
        check already judges deadlines (the two clocks drift by microseconds per second). A test's
        clock offset change (clock.set_offset: a new generation here, a ":*" wake-up elsewhere)
        forces a reading, as does ``fresh``.

        Args:
            fresh: read the database clock whatever the last reading.
            reuse: seconds a reading serves the passes that follow.
        """
        clock = time.monotonic()
        last = self.reading
        if (
            not fresh
            and last is not None
            and clock - last[1] < reuse
            and self._generation == offset_generation()
            and backend(self.using).has_clock
        ):
            self._last_now = max(self._last_now, last[0] + timedelta(seconds=clock - last[1]))
            return self._last_now
        generation = offset_generation()
        now = db_now(self.using)
        # Counted from the reply's arrival: an estimate can only lag the database clock (by the reply's
        # way back), so a timer or deadline never comes due early.
        self.reading, self._generation = (now, time.monotonic()), generation
        if timedelta(0) < self._last_now - now < ESTIMATE_JITTER:
            now = self._last_now  # not behind an estimate already handed out (a moved offset is more)
        self._last_now = now
        return now

    def estimate(self, clock: float) -> datetime | None:
        """The database clock at monotonic time ``clock`` judged from the last reading (slightly
        ahead: 10 ms), or None before the first reading."""
        if self.reading is None:
            return None
        return self.reading[0] + timedelta(seconds=clock - self.reading[1] + 0.01)
