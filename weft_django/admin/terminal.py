"""How runs ended: counts by terminal status per day and per type, recent failures, and what
retention (WEFT["RETENTION"]) removes next. Read-only; shared by the admin and the ``weft`` command.
The preview follows the engines' retention chore: a run is due once ``finished_at + RETENTION[status]``
has passed (workflow time), and a child is kept while its parent is still active."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import reduce
from operator import or_
from typing import Any

from django.db.models import BooleanField, Count, ExpressionWrapper, Q, QuerySet
from django.db.models.functions import TruncDate
from django.utils import timezone

from ..models import Workflow
from ..status import WorkflowStatus
from ..store.maintenance import kept_whatever_their_age
from ..store.moments import Readable, readable_rows, readable_values

TERMINAL_ORDER = (WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED, WorkflowStatus.TIMED_OUT)
FAILURE_STATUSES = (WorkflowStatus.FAILED, WorkflowStatus.TIMED_OUT)


@dataclass(frozen=True)
class DayCounts:
    day: date
    counts: dict[str, int]  # terminal status -> runs that ended that day

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def daily_counts(using: str, now: datetime, days: int = 14) -> list[DayCounts]:
    """Runs that ended on each of the last ``days`` days (local dates, oldest first), by status."""
    today = timezone.localtime(now).date()
    first = today - timedelta(days=days - 1)
    since = timezone.make_aware(datetime.combine(first, datetime.min.time()))
    # Up to the end of today: a finished_at in the future (an odd row, near year 9999) is not counted,
    # and its local date (possibly year 10000) is never computed.
    until = timezone.make_aware(datetime.combine(today + timedelta(days=1), datetime.min.time()))
    rows = (
        Workflow.objects.using(using)
        .filter(status__in=TERMINAL_ORDER, finished_at__gte=since, finished_at__lt=until)
        .annotate(day=TruncDate("finished_at", tzinfo=timezone.get_current_timezone()))
        .values("day", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    table: dict[date, dict[str, int]] = {first + timedelta(days=i): {} for i in range(days)}
    for row in rows:
        if row["day"] in table:
            table[row["day"]][row["status"]] = row["n"]
    return [DayCounts(day, {s.value: counts.get(s.value, 0) for s in TERMINAL_ORDER}) for day, counts in table.items()]


def type_counts(using: str, since: datetime) -> list[dict[str, Any]]:
    """Per workflow type: runs that ended since ``since``, by status, most ended first."""
    rows = (
        Workflow.objects.using(using)
        .filter(status__in=TERMINAL_ORDER, finished_at__gte=since)
        .values("workflow_type", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    table: dict[str, dict[str, int]] = {}
    for row in rows:
        table.setdefault(row["workflow_type"], {})[row["status"]] = row["n"]
    result: list[dict[str, Any]] = []
    for name, counts in table.items():
        ordered = {s.value: counts.get(s.value, 0) for s in TERMINAL_ORDER}
        result.append({"workflow_type": name, "counts": ordered, "total": sum(ordered.values())})
    result.sort(key=lambda item: (-item["total"], item["workflow_type"]))
    return result


def totals(using: str) -> dict[str, int]:
    """All-time counts of the runs still stored, by status (one query)."""
    counts = dict(
        Workflow.objects.using(using).values("status").annotate(n=Count("pk")).order_by().values_list("status", "n")
    )
    return {s.value: counts.get(s.value, 0) for s in WorkflowStatus}


def recent_failures(using: str, limit: int = 20) -> QuerySet[Workflow]:
    """The last ``limit`` failed or timed-out runs, a finished_at Python cannot represent (a hand edit)
    read as None and named in ``weft_unreadable`` (``store.moments.readable_rows``)."""
    return readable_rows(
        Workflow.objects.using(using)
        .filter(status__in=FAILURE_STATUSES)
        .order_by("-finished_at")
        .only("id", "workflow_type", "status", "error", "finished_at", "run_id")
    )[:limit]


def retention_due(
    using: str, now: datetime, retention: dict[str, timedelta | None], statuses: list[str] | None = None
) -> QuerySet[Workflow]:
    """Runs whose retention has passed: terminal, in ``statuses``, finished longer ago than their
    status's retention, and not kept whatever their age (a child of an active parent, a run in its
    queue's rate window: ``store.maintenance.kept_whatever_their_age``, as the engine's sweep). A
    status kept for ever (None) matches nothing."""
    parts = [
        Q(status=status, finished_at__lt=now - keep)
        for status, keep in retention.items()
        if keep is not None and (statuses is None or status in statuses)
    ]
    if not parts:
        return Workflow.objects.using(using).none()
    return kept_whatever_their_age(Workflow.objects.using(using).filter(reduce(or_, parts)), now, using)


def _due(finished_at: datetime, keep: timedelta) -> datetime:
    """When a run finished at ``finished_at`` becomes due; the last datetime when that is past year
    9999 (a finished_at near year 9999: an odd row)."""
    try:
        return finished_at + keep
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class RetentionRow:
    status: str
    keep: timedelta | None
    due_now: int
    next_due_at: datetime | None  # when the next run of this status becomes due (None: none pending)


def retention_plan(using: str, now: datetime, retention: dict[str, timedelta | None]) -> list[RetentionRow]:
    """Per terminal status: how long runs are kept, how many are due now, when the next one is due."""
    rows = []
    for status in TERMINAL_ORDER:
        keep = retention.get(status.value)
        if keep is None:
            rows.append(RetentionRow(status.value, None, 0, None))
            continue
        runs = kept_whatever_their_age(Workflow.objects.using(using).filter(status=status), now, using)
        due = runs.filter(finished_at__lt=now - keep).count()
        oldest_kept = (  # None too when it cannot be read (past year 9999: a hand edit), never due
            runs.filter(finished_at__gte=now - keep)
            .order_by("finished_at")
            .values_list(Readable("finished_at"), flat=True)
            .first()
        )
        rows.append(RetentionRow(status.value, keep, due, None if oldest_kept is None else _due(oldest_kept, keep)))
    return rows


def next_removals(
    using: str, now: datetime, retention: dict[str, timedelta | None], limit: int = 10
) -> list[dict[str, Any]]:
    """The ``limit`` runs retention removes first (those already due come first), with their due time.
    A finished_at Python cannot represent (a hand edit) is None, named under "unreadable" with its
    stored text; whether such a run is due is compared in SQL (its due_at is None)."""
    candidates: list[dict[str, Any]] = []
    for status in TERMINAL_ORDER:
        keep = retention.get(status.value)
        if keep is None:
            continue
        rows = readable_values(
            kept_whatever_their_age(
                Workflow.objects.using(using).filter(status=status, finished_at__isnull=False), now, using
            )
            .annotate(due_in_sql=ExpressionWrapper(Q(finished_at__lt=now - keep), output_field=BooleanField()))
            .order_by("finished_at"),
            ("id", "workflow_type", "finished_at", "due_in_sql"),
        )[:limit]
        for row in rows:
            finished_at = row["finished_at"]
            due_at = None if finished_at is None else _due(finished_at, keep)
            candidates.append(
                {
                    "id": row["id"],
                    "workflow_type": row["workflow_type"],
                    "status": status.value,
                    "finished_at": finished_at,
                    "due_at": due_at,
                    "due": due_at < now if due_at is not None else bool(row["due_in_sql"]),
                    **({"unreadable": row["unreadable"]} if "unreadable" in row else {}),
                }
            )
    candidates.sort(key=lambda row: (_order(row), row["id"]))
    return candidates[:limit]


def _order(row: dict[str, Any]) -> datetime:
    """A removal's place: its due time; one whose finished_at cannot be read first when due, else last."""
    if row["due_at"] is not None:
        return row["due_at"]
    return datetime.min.replace(tzinfo=UTC) if row["due"] else datetime.max.replace(tzinfo=UTC)
