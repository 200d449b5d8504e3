"""Retention: purge terminal workflows older than WEFT["RETENTION"][status] (an engine-scoped chore).

A run is purged once ``finished_at + RETENTION[status] < now`` (workflow time); a status mapped to
None is kept for ever. Each pass purges at most BATCH_SIZE runs, oldest first, through
``transitions.purge`` (claims deleted, idempotency keys marked purged; a later run under the same id
draws a higher epoch from the global sequence). While a pass finds a full batch the chore runs again
at the poll interval instead of every INTERVAL seconds, so a backlog drains in bounded steps. A child
is kept while its parent is still active.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from .. import transitions
from ..store.clock import db_now
from ..store.maintenance import expired_runs
from .host import EngineHost

logger = logging.getLogger(__name__)

INTERVAL = 60.0  # seconds between passes when there is no backlog
BATCH_SIZE = 500  # runs purged per pass, at most


class RetentionSweep:
    """The chore. One instance per engine (it remembers whether the last pass left a backlog)."""

    def __init__(self) -> None:
        self.backlog = False

    def interval(self, engine: EngineHost) -> float:
        return engine.settings.poll_interval.total_seconds() if self.backlog else INTERVAL

    def run(self, engine: EngineHost, now: datetime) -> bool:
        purged, self.backlog = purge_expired(engine.settings.retention, engine.using, now=now)
        if purged:
            logger.info("retention purged workflows count=%s engine=%s", purged, engine.engine_id)
        return purged > 0


def purge_expired(
    retention: dict[str, timedelta | None],
    using: str,
    batch_size: int | None = None,
    now: datetime | None = None,
) -> tuple[int, bool]:
    """Purge up to ``batch_size`` (default BATCH_SIZE) terminal runs expired at ``now`` (default: workflow
    time now), oldest first per status. Returns (how many were purged, whether more may be left)."""
    batch_size = batch_size or BATCH_SIZE
    now = now or db_now(using)
    budget = batch_size
    purged = 0
    for status, keep in retention.items():
        if keep is None or budget <= 0:
            continue
        cutoff = now - keep
        expired, ids = expired_runs(status, cutoff, budget, using, now)
        if not ids:
            continue
        budget -= len(ids)
        # The status and age are re-checked by the queryset, and the terminal status under lock by purge.
        # On the engine's loop: a run whose claim or row a user's open transaction holds is left for a
        # later pass, never waited for (it would stall every workflow of the engine for lock_timeout).
        purged += transitions.purge(expired.filter(pk__in=ids), using=using, batch_size=batch_size, wait=False)
    return purged, budget <= 0
