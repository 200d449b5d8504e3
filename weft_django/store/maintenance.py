"""Engine-scoped chores' statements: retention purge and sweeps."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from ..models import Workflow
from ..status import ACTIVE_STATUSES

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


def expired_runs(
    status: str, cutoff: datetime, limit: int, using: str, admitted_since: Mapping[str, datetime] | None = None
) -> tuple[QuerySet[Workflow], list[Any]]:
    """The runs of ``status`` that finished before ``cutoff``, and the ids of the oldest ``limit`` of
    them whose parent is not active (a child is kept while its parent runs).

    Args:
        admitted_since: per rate-limited queue, the start of its rate window: a run it admitted since is
            kept (the queue counts its admissions in the window from their rows).

    Returns:
        (the queryset of every expired run of that status, re-checked by a purge; the ids to purge).
    """
    expired = Workflow.objects.using(using).filter(status=status, finished_at__lt=cutoff)
    for queue, since in (admitted_since or {}).items():
        expired = expired.exclude(Q(queue=queue, admitted_at__gt=since))
    parent_active = Workflow.objects.using(using).filter(pk=OuterRef("parent_id"), status__in=list(ACTIVE_STATUSES))
    ids = list(expired.exclude(Exists(parent_active)).order_by("finished_at").values_list("pk", flat=True)[:limit])
    return expired, ids
