"""The ownership, terminal-states and queues pages. Called by WorkflowAdmin's custom URLs, which wrap them
in ``admin_site.admin_view`` and check the view permission first."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from ..conf import get_settings
from . import health, terminal
from .base import WeftModelAdmin
from .clocks import claim_now, workflow_now
from .formatting import (
    error_summary,
    format_duration,
    heartbeat_age,
    marked,
    moment_of,
    relative,
    state_badge,
    status_badge,
    unreadable_moment,
)
from .queues import queue_report

DAYS = 14
REFRESH_CHOICES = (0, 5, 15, 60)


def _url(modeladmin: WeftModelAdmin, name: str, *args: Any) -> str | None:
    try:
        return reverse(f"{modeladmin.admin_site.name}:{name}", args=args)
    except NoReverseMatch:
        return None


def links(modeladmin: WeftModelAdmin) -> list[dict[str, str | None]]:
    """The object-tools links of the workflow changelist."""
    return [
        {"label": "Ownership", "url": _url(modeladmin, "weft_django_workflow_ownership")},
        {"label": "Terminal states", "url": _url(modeladmin, "weft_django_workflow_terminal")},
        {"label": "Queues", "url": _url(modeladmin, "weft_django_workflow_queues")},
    ]


def _change_url(modeladmin: WeftModelAdmin, workflow_id: str) -> str | None:
    return _url(modeladmin, "weft_django_workflow_change", quote(workflow_id))


def _context(modeladmin: WeftModelAdmin, request: HttpRequest, title: str) -> dict[str, Any]:
    return {
        **modeladmin.admin_site.each_context(request),
        "opts": modeladmin.model._meta,
        "title": title,
        "media": modeladmin.media,
        "changelist_url": _url(modeladmin, "weft_django_workflow_changelist"),
        "links": links(modeladmin),
    }


def _refresh(request: HttpRequest) -> int:
    try:
        seconds = int(request.GET.get("refresh", "0"))
    except ValueError:
        return 0
    return seconds if seconds in REFRESH_CHOICES else 0


def _marked_or(unreadable: dict[str, str], name: str, shown: Any) -> Any:
    """``shown``, or the column's ``unreadable_moment`` when a row's ``name`` could not be read."""
    return unreadable_moment(unreadable[name]) if name in unreadable else shown


def ownership(modeladmin: WeftModelAdmin, request: HttpRequest) -> TemplateResponse:
    """Engines (alive / dead / stopped, claims held) and the claims they hold, soonest expiry first."""
    settings = get_settings()
    using = modeladmin.weft_alias
    now = claim_now(request)
    ttl = settings.workflow_claim_ttl
    engines = health.engine_rows(using, now, ttl)
    claims = health.claim_rows(using, now, ttl, limit=200)
    summary = health.ownership_summary(using, now, ttl, engines)
    # a time a hand edit put out of Python's reach is None in the rows: shown marked, with its stored text
    engine_items = [
        {
            "row": row,
            "badge": state_badge(row.state),
            "started": _marked_or(row.unreadable, "started_at", row.engine.started_at),
            "heartbeat_age": _marked_or(
                row.unreadable,
                "heartbeat_at",
                None if row.heartbeat_age is None else heartbeat_age(row.heartbeat_age),
            ),
            "uptime": "-"
            if row.unreadable
            else format_duration((row.engine.stopped_at or now) - row.engine.started_at),
        }
        for row in engines
    ]
    claim_items = [
        {
            "row": row,
            "url": _change_url(modeladmin, row.workflow_id),
            "badge": status_badge(row.status) if row.status else "-",
            "claimed": _marked_or(row.unreadable, "claimed_at", row.claimed_at),
            "expires": _marked_or(row.unreadable, "expires_at", relative(row.expires_at, now)),
            "state": state_badge("lapsed") if row.lapsed else state_badge("held"),
        }
        for row in claims
    ]
    context = {
        **_context(modeladmin, request, "Workflow ownership"),
        "now": now,
        "settings": settings,
        "ttl": format_duration(ttl),
        "renew": format_duration(settings.workflow_claim_renew_interval),
        "engines": engine_items,
        "claims": claim_items,
        "claims_truncated": summary.held > len(claims),
        "summary": summary,
        "refresh": _refresh(request),
        "refresh_choices": REFRESH_CHOICES,
        "lapsed_filter_url": (_url(modeladmin, "weft_django_workflow_changelist") or "") + "?ownership=lapsed",
        "unowned_filter_url": (_url(modeladmin, "weft_django_workflow_changelist") or "")
        + "?ownership=unowned&status__exact=running",
    }
    return TemplateResponse(request, "admin/weft_django/ownership.html", context)


def _bars(days: list[terminal.DayCounts]) -> list[dict[str, Any]]:
    peak = max([day.total for day in days] + [1])
    rows = []
    for day in days:
        segments = [
            {"status": status, "count": count, "width": round(count / peak * 100, 2)}
            for status, count in day.counts.items()
            if count
        ]
        rows.append({"day": day.day, "total": day.total, "counts": day.counts, "segments": segments})
    return rows


def terminal_states(modeladmin: WeftModelAdmin, request: HttpRequest) -> TemplateResponse:
    """How runs ended over the last two weeks, recent failures, and what retention removes next."""
    settings = get_settings()
    using = modeladmin.weft_alias
    now = workflow_now(request)
    days = terminal.daily_counts(using, now, DAYS)
    since = timezone.make_aware(datetime.combine(days[0].day, datetime.min.time()))
    failures = [
        {
            "workflow": row,
            "url": _change_url(modeladmin, row.id),
            "badge": status_badge(row.status),
            "error": error_summary(row.error) or "-",
            "ago": moment_of(row, "finished_at") if row.finished_at is None else relative(row.finished_at, now),
        }
        for row in terminal.recent_failures(using)
    ]
    plan = [
        {
            "row": row,
            "keep": "kept for ever" if row.keep is None else format_duration(row.keep),
            "next": relative(row.next_due_at, now) if row.next_due_at else "-",
        }
        for row in terminal.retention_plan(using, now, settings.retention)
    ]
    removals = [marked(row) for row in terminal.next_removals(using, now, settings.retention)]
    for row in removals:
        row["url"] = _change_url(modeladmin, row["id"])
        row["badge"] = status_badge(row["status"])
        row["when"] = "due now" if row["due"] else relative(row["due_at"], now) if row["due_at"] else "never"
    context = {
        **_context(modeladmin, request, "Terminal states"),
        "now": now,
        "days": DAYS,
        "statuses": [status.value for status in terminal.TERMINAL_ORDER],
        "status_labels": [status.label for status in terminal.TERMINAL_ORDER],
        "bars": _bars(days)[::-1],  # newest first
        "window_total": sum(day.total for day in days),
        "by_type": terminal.type_counts(using, since),
        "totals": terminal.totals(using),
        "failures": failures,
        "plan": plan,
        "removals": removals,
        "retention_window": timedelta(days=DAYS),
    }
    return TemplateResponse(request, "admin/weft_django/terminal.html", context)


def queues_page(modeladmin: WeftModelAdmin, request: HttpRequest) -> TemplateResponse:
    """Each queue: limits, waiting, running, admissions in its rate window, keys in use, serving engines;
    each limited activity: attempts holding a slot."""
    settings = get_settings()
    report = queue_report(settings, modeladmin.weft_alias, settings.workflow_claim_ttl)
    changelist = _url(modeladmin, "weft_django_workflow_changelist") or ""
    report["queues"] = [marked(row) for row in report["queues"]]  # a damaged oldest start: shown marked
    for row in report["queues"]:
        row["waiting_url"] = f"{changelist}?queue={quote(row['queue'])}&status__exact=pending"
    context = {
        **_context(modeladmin, request, "Queues"),
        **report,
        "refresh": _refresh(request),
        "refresh_choices": REFRESH_CHOICES,
    }
    return TemplateResponse(request, "admin/weft_django/queues.html", context)
