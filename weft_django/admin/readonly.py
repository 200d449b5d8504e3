"""Read-only admins for engine-owned rows: claims, engines, timers, signals and pending updates.
Nobody adds, edits or deletes them here; the engine and the public API are their only writers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import Count, DateTimeField, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..conf import database_alias
from ..models import BufferedSignal, Engine, PendingUpdate, Timer, WorkflowClaim
from ..store.claims import holder_heartbeat, holder_silent
from ..store.moments import Readable, readable_rows
from .base import GuardedChangelist
from .clocks import claim_now, claim_ttl, workflow_now
from .filters import ClaimStateFilter
from .formatting import (
    claim_expiry_badge,
    error_summary,
    heartbeat_age,
    moment_of,
    pretty_json,
    pretty_payload,
    relative,
    state_badge,
)
from .health import engine_state, readable_engines


class ReadOnlyAdmin(GuardedChangelist):
    """View permission only: no add, change or delete, for anyone."""

    list_per_page = 100
    show_full_result_count = False

    class Media:
        css = {"all": ("weft_django/admin.css",)}

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(database_alias())

    def workflow_link(self, obj: Any) -> SafeString:
        workflow_id = obj.workflow_id
        url = reverse(f"{self.admin_site.name}:weft_django_workflow_change", args=[quote(workflow_id)])
        return format_html('<a href="{}">{}</a>', url, workflow_id)

    workflow_link.short_description = "workflow"  # type: ignore[attr-defined]
    workflow_link.admin_order_field = "workflow_id"  # type: ignore[attr-defined]


def _pre(text: str) -> SafeString:
    return format_html('<pre class="weft-pre">{}</pre>', text)


def moment_column(field: str, description: str) -> Callable[[Any, Any], SafeString | str]:
    """A sortable column (and read-only field) for the timestamp ``field``: Django's own rendering
    raises OverflowError for a time a day from the ends of Python's dates (an odd row); ``moment``
    shows it in UTC, marked; one Python cannot represent at all, "unreadable timestamp (<stored>)"."""

    @admin.display(description=description, ordering=field)
    def show(self: Any, obj: Any) -> SafeString | str:
        return moment_of(obj, field)

    show.__name__ = f"{field}_display"
    return show


@admin.register(WorkflowClaim)
class WorkflowClaimAdmin(ReadOnlyAdmin):
    list_display = (
        "workflow_link",
        "engine_id",
        "epoch",
        "claimed_at_display",
        "expires_at_display",
        "expiry_display",
        "last_holder_display",
    )
    list_filter = (ClaimStateFilter,)
    search_fields = ("workflow_id", "engine_id")
    ordering = ("expires_at",)
    fields = list_display
    readonly_fields = fields
    claimed_at_display = moment_column("claimed_at", "claimed at")
    expires_at_display = moment_column("expires_at", "expires at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        using, now = database_alias(), claim_now(request)
        annotated = (
            super()
            .get_queryset(request)
            .annotate(
                observed_at=Value(now, output_field=DateTimeField()),
                holder_heartbeat=Readable(holder_heartbeat(using)),
                holder_silent=holder_silent(using, now, claim_ttl(request)),
            )
        )
        return readable_rows(annotated)  # an expiry Python cannot represent (a hand edit): shown marked

    @admin.display(description="expires")
    def expiry_display(self, obj: WorkflowClaim) -> SafeString | str:
        if obj.engine_id is not None and "expires_at" in obj.weft_unreadable:  # type: ignore[attr-defined]
            return moment_of(obj, "expires_at")
        if obj.engine_id is None or obj.expires_at is None:
            return "released" if obj.engine_id is None else "-"
        return claim_expiry_badge(obj.expires_at, obj.holder_heartbeat, obj.holder_silent, obj.observed_at)  # type: ignore[attr-defined]

    @admin.display(description="last held by", ordering="last_engine_id")
    def last_holder_display(self, obj: WorkflowClaim) -> str:
        """For a released claim, the engine that last took it (e.g. the one that ran it to its end)."""
        if obj.engine_id is not None:
            return "-"  # held: the engine column names the holder
        return obj.last_engine_id or "-"


@admin.register(Engine)
class EngineAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "state_display",
        "host",
        "pid",
        "mode",
        "started_at_display",
        "heartbeat_display",
        "stopped_at_display",
        "claims_held",
    )
    list_filter = ("mode",)
    search_fields = ("id", "host")
    ordering = ("-heartbeat_at",)
    fields = (
        "id",
        "state_display",
        "host",
        "pid",
        "mode",
        "started_at_display",
        "heartbeat_at_display",
        "heartbeat_display",
        "stopped_at_display",
        "claims_held",
    )
    readonly_fields = fields
    started_at_display = moment_column("started_at", "started at")
    heartbeat_at_display = moment_column("heartbeat_at", "heartbeat at")
    stopped_at_display = moment_column("stopped_at", "stopped at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        now, ttl = claim_now(request), claim_ttl(request)
        held = (
            WorkflowClaim.objects.using(database_alias())
            .filter(engine_id=OuterRef("pk"))
            .order_by()
            .values("engine_id")
            .annotate(n=Count("pk"))
            .values("n")
        )
        annotated = (
            super()
            .get_queryset(request)
            .annotate(
                held=Coalesce(Subquery(held, output_field=IntegerField()), 0),
                observed_at=Value(now, output_field=DateTimeField()),
            )
        )
        return readable_engines(annotated, now, ttl)  # a time Python cannot represent (a hand edit): shown marked

    @admin.display(description="state")
    def state_display(self, obj: Engine) -> SafeString:
        return state_badge(engine_state(obj))

    @admin.display(description="last heartbeat", ordering="heartbeat_at")
    def heartbeat_display(self, obj: Engine) -> SafeString | str:
        if obj.heartbeat_at is None:  # unreadable (store.moments): its stored text, marked
            return moment_of(obj, "heartbeat_at")
        return heartbeat_age(obj.observed_at - obj.heartbeat_at)  # type: ignore[attr-defined]

    @admin.display(description="claims held", ordering="held")
    def claims_held(self, obj: Engine) -> int:
        return int(obj.held)  # type: ignore[attr-defined]


@admin.register(Timer)
class TimerAdmin(ReadOnlyAdmin):
    list_display = ("workflow_link", "kind", "seq", "attempt", "fire_at_display", "due_display")
    list_filter = ("kind",)
    search_fields = ("workflow_id",)
    ordering = ("fire_at",)
    fields = ("workflow_link", "run_id", "kind", "seq", "attempt", "fire_at_display", "due_display")
    readonly_fields = fields
    fire_at_display = moment_column("fire_at", "fire at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return (
            super()
            .get_queryset(request)
            .annotate(observed_at=Value(workflow_now(request), output_field=DateTimeField()))
        )

    @admin.display(description="due")
    def due_display(self, obj: Timer) -> SafeString | str:
        now = obj.observed_at  # type: ignore[attr-defined]
        if obj.fire_at < now:
            return format_html('<span class="weft-lapsed">overdue {}</span>', relative(obj.fire_at, now))
        return relative(obj.fire_at, now)


@admin.register(BufferedSignal)
class BufferedSignalAdmin(ReadOnlyAdmin):
    list_display = ("workflow_link", "name", "signal_id", "state", "consumed_seq", "created_at_display")
    list_filter = ("state",)
    search_fields = ("workflow_id", "name", "signal_id")
    ordering = ("-id",)
    fields = (
        "workflow_link",
        "run_id",
        "name",
        "signal_id",
        "state",
        "consumed_seq",
        "created_at_display",
        "payload_display",
    )
    readonly_fields = fields
    created_at_display = moment_column("created_at", "created at")

    @admin.display(description="payload")
    def payload_display(self, obj: BufferedSignal) -> SafeString:
        return _pre(pretty_payload(obj.payload))


@admin.register(PendingUpdate)
class PendingUpdateAdmin(ReadOnlyAdmin):
    list_display = ("workflow_link", "name", "status", "created_at_display", "completed_at_display", "outcome")
    list_filter = ("status",)
    search_fields = ("workflow_id", "name", "idempotency_key")
    ordering = ("-created_at",)
    fields = (
        "workflow_link",
        "id",
        "run_id",
        "name",
        "idempotency_key",
        "status",
        "created_at_display",
        "completed_at_display",
        "payload_display",
        "result_display",
        "error_display",
    )
    readonly_fields = fields
    created_at_display = moment_column("created_at", "created at")
    completed_at_display = moment_column("completed_at", "completed at")

    @admin.display(description="outcome")
    def outcome(self, obj: PendingUpdate) -> str:
        if obj.error:
            return error_summary(obj.error)
        if obj.issues:
            return "; ".join(str(i.get("message", i)) if isinstance(i, dict) else str(i) for i in obj.issues)
        if obj.result is not None:
            text = pretty_payload(obj.result)
            return text if len(text) <= 80 else text[:77] + "..."
        return "-"

    @admin.display(description="payload")
    def payload_display(self, obj: PendingUpdate) -> SafeString:
        return _pre(pretty_payload(obj.payload))

    @admin.display(description="result")
    def result_display(self, obj: PendingUpdate) -> SafeString | str:
        return _pre(pretty_payload(obj.result)) if obj.result is not None else "-"

    @admin.display(description="error / issues")
    def error_display(self, obj: PendingUpdate) -> SafeString | str:
        value = obj.error or obj.issues
        return _pre(pretty_json(value)) if value else "-"
