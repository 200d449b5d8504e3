"""Garbage collection of timers whose workflow is missing or terminal. A suspended workflow keeps its
timers: the engine that claims it after resume re-arms them at their recorded fire times.
Engine-scoped, bounded per pass."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from django.db.models import Exists, OuterRef

from ..models import Timer, Workflow
from ..status import TERMINAL_STATUSES, TimerKind

if TYPE_CHECKING:
    from .engine import Engine

logger = logging.getLogger(__name__)
SWEEP_BATCH = 500


def collect_orphaned_timers(engine: Engine, now: datetime) -> bool:
    using = engine.using
    missing = ~Exists(Workflow.objects.using(using).filter(pk=OuterRef("workflow_id")))
    terminal = Exists(
        Workflow.objects.using(using).filter(pk=OuterRef("workflow_id"), status__in=list(TERMINAL_STATUSES))
    )
    doomed = list(
        Timer.objects.using(using)
        .exclude(kind__in=[TimerKind.SCHEDULE])
        .filter(missing | terminal)
        .values_list("pk", flat=True)[:SWEEP_BATCH]
    )
    if doomed:
        Timer.objects.using(using).filter(pk__in=doomed).delete()
        logger.info("collected orphaned timers count=%s engine=%s", len(doomed), engine.engine_id)
    return bool(doomed)
