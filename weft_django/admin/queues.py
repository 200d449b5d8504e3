"""What the queues page and ``weft queues`` show: per queue of WEFT["QUEUES"] (and any queue active
runs name): its limits, waiting runs, running runs (admitted, not ended), admissions in the rate
window, the concurrency keys in use and the live engines that serve it; per limited activity: the
attempts holding a slot now. Read-only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ..conf import WeftSettings
from ..store import limits, queues


def queue_report(settings: WeftSettings, using: str, ttl: timedelta) -> dict[str, Any]:
    """{"queues": [...], "activities": [...]}: one dict per queue and per limited activity.

    Args:
        settings: the WEFT settings (its QUEUES); ``using``: the connection alias.
        ttl: an engine heartbeating within it is alive.
    """
    configured = dict(settings.queues)
    names = sorted(set(configured) | set(queues.queues_in_use(using)))
    windows = {name: config.rate.period for name, config in configured.items() if config.rate is not None}
    live = queues.served_queues(within=ttl, using=using)
    rows = []
    for stats in queues.queue_stats(names, using, windows=windows):
        name = stats["queue"]
        config = configured.get(name)
        served = sorted(engine for engine, served in live.items() if served is None or name in served)
        rows.append(
            {
                **stats,
                "configured": config is not None,
                "concurrency": config.concurrency if config else None,
                "per_engine": config.per_engine if config else None,
                "rate": str(config.rate) if config and config.rate else None,
                "priorities": bool(config and config.priorities),
                "served_by": served if config is not None else [],
            }
        )
    return {"queues": rows, "activities": limits.slot_stats(using)}
