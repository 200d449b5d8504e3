"""Engine-scoped chores' statements: retention purge and sweeps."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from ..conf import queues
from ..models import Workflow
from ..status import ACTIVE_STATUSES

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


def rate_windows(now: datetime) -> dict[str, datetime]:
    """Per rate-limited queue (WEFT["QUEUES"]), the start of its rate window at ``now``."""
    return {name: now - queue.rate.period for name, queue in queues().items() if queue.rate is not None}


def kept_whatever_their_age(runs: QuerySet[Workflow], now: datetime, using: str) -> QuerySet[Workflow]:
    """``runs`` less those retention keeps whatever RETENTION says: a child whose parent is still
    active, and a run a rate-limited queue admitted within its rate window (the queue counts its
    admissions from their rows). The one rule for the engine's sweep, ``weft purge`` and the admin."""
    for queue, since in rate_windows(now).items():
        runs = runs.exclude(Q(queue=queue, admitted_at__gt=since))
    parent_active = Workflow.objects.using(using).filter(pk=OuterRef("parent_id"), status__in=list(ACTIVE_STATUSES))
    return runs.exclude(Exists(parent_active))


def expired_runs(
    status: str, cutoff: datetime, limit: int, using: str, now: datetime
) -> tuple[QuerySet[Workflow], list[Any]]:
    """The runs of ``status`` that finished before ``cutoff`` and that retention does not keep
    (``kept_whatever_their_age`` at ``now``), and the ids of the oldest ``limit`` of them.

    Returns:
        (the queryset of every expired run of that status, re-checked by a purge under the claims'
        lock; the ids to purge).
    """
    expired = Workflow.objects.using(using).filter(status=status, finished_at__lt=cutoff)
    expired = kept_whatever_their_age(expired, now, using)
    ids = list(expired.order_by("finished_at").values_list("pk", flat=True)[:limit])
    return expired, ids
