"""The Workflow admin: a read-only changelist with ownership columns, a change page with the step
timeline, the actions, and the ownership and terminal-states views (custom URLs, each re-checking
permissions)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import DataError
from django.db.models import DateTimeField, QuerySet, Value
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..exceptions import InvalidArgumentError
from ..models import BufferedSignal, PendingUpdate, Step, Timer, Workflow
from ..status import ACTIVE_STATUSES, TERMINAL_STATUSES, WorkflowStatus
from ..store.claims import holder_silent
from ..store.moments import readable_rows, readable_values, unreadable_bounds
from ..store.visibility import read as search_attributes_of
from ..validation import validate_reason, validate_workflow_id
from . import actions, health, views, visibility
from .base import WeftModelAdmin
from .clocks import claim_now, claim_ttl, workflow_now
from .filters import (
    ActivityFilter,
    AttributeFilter,
    OwnershipFilter,
    ParentFilter,
    ScheduleFilter,
    search_by_attributes,
)
from .formatting import (
    claim_expiry_badge,
    error_summary,
    marked,
    moment_of,
    pretty_json,
    pretty_payload,
    relative,
    short_step,
    status_badge,
    unreadable_moment,
)
from .run_chain import run_chain
from .timeline import build_timeline

CHILDREN_SHOWN = 50
HIERARCHY_HIDDEN = (
    "The date hierarchy is hidden: a workflow's created_at is too close to year 1 or 9999 to show in this time "
    "zone, or not a time Python can represent (an odd row, edited by hand?). Sort by created to find it."
)
ROWS_SHOWN = 200


def _claim_expiry(obj: Any) -> SafeString | str:
    expires_at = getattr(obj, "claim_expires_at", None)
    if getattr(obj, "owner_engine", None) is not None and obj.claim_expires_unreadable is not None:
        return unreadable_moment(obj.claim_expires_unreadable)  # a hand edit Python cannot represent
    if getattr(obj, "owner_engine", None) is None or expires_at is None:
        return "-"
    return claim_expiry_badge(expires_at, obj.owner_heartbeat, obj.owner_silent, obj.observed_at)


def _pre(text: str) -> SafeString:
    return format_html('<pre class="weft-pre">{}</pre>', text)


def _error_block(error: Any) -> SafeString | str:
    if not error:
        return "-"
    if not isinstance(error, dict):
        return format_html('<span class="weft-odd">not an error object</span>{}', _pre(pretty_json(error)))
    extra = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
    return format_html(
        '<div class="weft-error"><strong>{}</strong>{}{}</div>',
        error_summary(error),
        _pre(pretty_json(extra)) if extra else "",
        format_html("<details open><summary>Traceback</summary>{}</details>", _pre(error["traceback"]))
        if error.get("traceback")
        else "",
    )


def _attribute_text(value: Any) -> str:
    if isinstance(value, SafeString):  # marked already (a time Python cannot represent)
        return value
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    if isinstance(value, datetime):
        return value.isoformat()
    return repr(value) if isinstance(value, str) else str(value)


def _field_names(fieldsets: Any) -> tuple[str, ...]:
    """Every field named in ``fieldsets`` (all of them are read-only here)."""
    return tuple(
        name
        for _, options in fieldsets
        for line in options["fields"]
        for name in (line if isinstance(line, tuple) else (line,))
    )


@admin.register(Workflow)
class WorkflowAdmin(WeftModelAdmin):
    list_display = (
        "id",
        "status_display",
        "workflow_type",
        "owner_display",
        "epoch_display",
        "claim_expiry_display",
        "current_step_display",
        "created_display",
        "updated_display",
    )
    list_filter = (
        "status",
        ActivityFilter,
        OwnershipFilter,
        ("workflow_type", admin.AllValuesFieldListFilter),
        AttributeFilter,
        ScheduleFilter,
        ParentFilter,
        ("queue", admin.AllValuesFieldListFilter),
    )
    search_fields = ("id",)
    search_help_text = "An id, or filters such as customer=acme amount__gte=10 status=failed (see docs/visibility.md)."

    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    list_per_page = 50
    show_full_result_count = False  # one COUNT less on big tables
    actions = [*actions.ACTIONS, visibility.fork_workflow]
    change_list_template = "admin/weft_django/workflow/change_list.html"
    change_form_template = "admin/weft_django/workflow/change_form.html"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("id", "status_display"),
                    ("workflow_type", "version"),
                    ("run_id", "current_step_display"),
                )
            },
        ),
        ("Ownership", {"fields": (("owner_display", "epoch_display", "claim_expiry_display"),)}),
        (
            "Times",
            {
                "fields": (
                    ("created_at_display", "started_display"),
                    ("updated_at_display", "finished_display"),
                    ("start_at_display", "deadline_display"),
                )
            },
        ),
        (
            "Input and outcome",
            {"fields": ("input_display", "result_display", "error_display", "stuck_display", "cancel_reason")},
        ),
        ("Origin", {"fields": (("parent_display", "schedule_id", "idempotency_key"),)}),
        ("Search attributes", {"fields": ("attributes_display",)}),
    )
    readonly_fields = _field_names(fieldsets)

    class Media:
        css = {"all": ("weft_django/admin.css",)}

    # -- read-only: engine-owned state is changed by actions only ----------------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return False

    def _has_weft_permission(self, request: HttpRequest, action: str) -> bool:
        codename = actions.CODENAMES[actions.PERMISSION_OF[action]]
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has_weft_permission(request, "cancel")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has_weft_permission(request, "retry")

    def has_signal_permission(self, request: HttpRequest) -> bool:
        return self._has_weft_permission(request, "signal")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return self._has_weft_permission(request, "purge")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workflow]:
        """Workflows with their claim (holder, epoch, expiry) and last step, as subqueries: the
        changelist stays one query however many rows it shows."""
        queryset = super().get_queryset(request).using(self.weft_alias)
        now = claim_now(request)
        annotated = health.with_ownership(queryset, self.weft_alias).annotate(
            observed_at=Value(now, output_field=DateTimeField()),
            owner_silent=holder_silent(self.weft_alias, now, claim_ttl(request), engine="owner_engine"),
        )
        # A timestamp Python cannot represent (a hand edit) reads as None and is shown marked
        # (obj.weft_unreadable), instead of failing the whole page.
        return readable_rows(annotated)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Workflow], search_term: str
    ) -> tuple[QuerySet[Workflow], bool]:
        """KEY=VALUE words filter by search attributes and list_workflows filters; the rest search ids."""
        queryset, rest = search_by_attributes(request, queryset, search_term)
        return super().get_search_results(request, queryset, rest)

    # -- columns and fields ------------------------------------------------------------------
    @admin.display(description="status", ordering="status")
    def status_display(self, obj: Workflow) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description="owner engine", ordering="owner_engine")
    def owner_display(self, obj: Workflow) -> str:
        return getattr(obj, "owner_engine", None) or "-"

    @admin.display(description="epoch", ordering="claim_epoch")
    def epoch_display(self, obj: Workflow) -> Any:
        epoch = getattr(obj, "claim_epoch", None)
        return "-" if epoch is None else epoch

    @admin.display(description="claim expiry", ordering="claim_expiry_stored")
    def claim_expiry_display(self, obj: Workflow) -> SafeString | str:
        return _claim_expiry(obj)

    @admin.display(description="current step")
    def current_step_display(self, obj: Workflow) -> str:
        return short_step(health.current_step(obj)) or "-"

    @admin.display(description="created", ordering="created_at")
    def created_display(self, obj: Workflow) -> SafeString | str:
        return moment_of(obj, "created_at", short=True)

    @admin.display(description="created")
    def created_at_display(self, obj: Workflow) -> SafeString | str:
        return moment_of(obj, "created_at")

    @admin.display(description="updated", ordering="updated_at")
    def updated_display(self, obj: Workflow) -> SafeString | str:
        now = obj.observed_at  # type: ignore[attr-defined]
        if obj.updated_at is None:  # unreadable (a hand edit): shown marked
            return moment_of(obj, "updated_at")
        return format_html('<span title="{}">{}</span>', obj.updated_at.isoformat(), relative(obj.updated_at, now))

    @admin.display(description="updated")
    def updated_at_display(self, obj: Workflow) -> SafeString | str:
        return moment_of(obj, "updated_at")

    @admin.display(description="started")
    def started_display(self, obj: Workflow) -> SafeString | str:
        return moment_of(obj, "started_at")

    @admin.display(description="finished")
    def finished_display(self, obj: Workflow) -> SafeString | str:
        return moment_of(obj, "finished_at")

    @admin.display(description="delayed until")
    def start_at_display(self, obj: Workflow) -> SafeString | str:
        return moment_of(obj, "start_at")

    @admin.display(description="execution deadline")
    def deadline_display(self, obj: Workflow) -> SafeString | str:
        return moment_of(obj, "execution_deadline")

    @admin.display(description="input")
    def input_display(self, obj: Workflow) -> SafeString:
        return _pre(pretty_payload(obj.input))

    @admin.display(description="result")
    def result_display(self, obj: Workflow) -> SafeString | str:
        return _pre(pretty_payload(obj.result)) if obj.status == WorkflowStatus.COMPLETED else "-"

    @admin.display(description="error")
    def error_display(self, obj: Workflow) -> SafeString | str:
        return _error_block(obj.error)

    @admin.display(description="stuck on")
    def stuck_display(self, obj: Workflow) -> SafeString | str:
        if not obj.stuck_error:
            return "-"
        retry = format_html(" — attempt {}, next retry {}", obj.stuck_attempts, moment_of(obj, "stuck_retry_at"))
        due = obj.stuck_retry_at is not None or "stuck_retry_at" in getattr(obj, "weft_unreadable", {})
        return format_html("{}{}", _error_block(obj.stuck_error), retry if due else "")

    @admin.display(description="attributes")
    def attributes_display(self, obj: Workflow) -> SafeString | str:
        """The run's search attributes (``ctx.set_attributes``, ``start(attributes=)``), by name."""
        damaged: dict[str, dict[str, str]] = {}
        found = search_attributes_of([obj.pk], self.weft_alias, damaged).get(obj.pk, {})
        for name, stored in damaged.get(obj.pk, {}).items():  # a time Python cannot represent (a hand edit)
            found[name.removeprefix("attributes.")] = unreadable_moment(stored)
        if not found:
            return "-"
        return format_html_join(
            "", "<div><code>{}</code> = {}</div>", ((name, _attribute_text(found[name])) for name in sorted(found))
        )

    @admin.display(description="parent")
    def parent_display(self, obj: Workflow) -> SafeString | str:
        if not obj.parent_id:
            return "-"
        url = reverse(f"{self.admin_site.name}:weft_django_workflow_change", args=[quote(obj.parent_id)])
        return format_html('<a href="{}">{}</a> (step #{})', url, obj.parent_id, obj.parent_seq)

    # -- the change page ---------------------------------------------------------------------
    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        workflow = self.get_object(request, unquote(object_id))
        extra = dict(extra_context or {})
        if workflow is not None and self.has_view_permission(request, workflow):
            extra.update(self._detail_context(request, workflow))
        return super().change_view(request, object_id, form_url, extra)

    def _detail_context(self, request: HttpRequest, workflow: Workflow) -> dict[str, Any]:
        using = self.weft_alias
        now = workflow_now(request)
        chain = run_chain(request, workflow, using)  # continue-as-new: ?run= shows an earlier run's steps
        steps = list(Step.objects.using(using).filter(run_id=chain["viewed_run_id"]).order_by("seq"))
        timers = list(Timer.objects.using(using).filter(workflow_id=workflow.pk).order_by("fire_at"))
        signals = list(BufferedSignal.objects.using(using).filter(workflow_id=workflow.pk).order_by("-id")[:ROWS_SHOWN])
        updates = list(
            PendingUpdate.objects.using(using).filter(workflow_id=workflow.pk).order_by("-created_at")[:ROWS_SHOWN]
        )
        children: list[dict[str, Any]] = [
            {
                **marked(row),
                "url": reverse(f"{self.admin_site.name}:weft_django_workflow_change", args=[quote(row["id"])]),
                "badge": status_badge(row["status"]),
            }
            for row in readable_values(
                Workflow.objects.using(using).filter(parent_id=workflow.pk).order_by("created_at"),
                ("id", "workflow_type", "status", "created_at", "finished_at"),
            )[: CHILDREN_SHOWN + 1]
        ]
        for timer in timers:
            timer.relative = relative(timer.fire_at, now)  # type: ignore[attr-defined]
        for signal in signals:
            signal.pretty = pretty_payload(signal.payload)  # type: ignore[attr-defined]
        for update in updates:
            update.pretty_payload = pretty_payload(update.payload)  # type: ignore[attr-defined]
            update.pretty_result = pretty_payload(update.result) if update.result is not None else ""  # type: ignore[attr-defined]
            update.error_text = error_summary(update.error)  # type: ignore[attr-defined]
            update.issues_text = "; ".join(  # type: ignore[attr-defined]
                str(issue.get("message", issue)) if isinstance(issue, dict) else str(issue)
                for issue in (update.issues or [])
            )
        return {
            "timeline": build_timeline(workflow, steps, timers, now),
            "timers": timers,
            "signals": signals,
            "updates": updates,
            "children": children[:CHILDREN_SHOWN],
            "more_children": len(children) > CHILDREN_SHOWN,
            "object_actions": self._object_actions(request, workflow),
            "run_chain": chain,
        }

    def _object_actions(self, request: HttpRequest, workflow: Workflow) -> list[dict[str, str]]:
        """The buttons of the change page: what this user may do to this run in its status."""
        status = workflow.status
        possible = [
            ("cancel", "Cancel…", status in ACTIVE_STATUSES),
            ("suspend", "Suspend", status == WorkflowStatus.RUNNING),
            ("resume", "Resume", status == WorkflowStatus.SUSPENDED),
            ("retry", "Retry from checkpoint", status == WorkflowStatus.FAILED),
            ("signal", "Send signal…", status in ACTIVE_STATUSES),
            ("purge", "Purge…", status in TERMINAL_STATUSES),
        ]
        return [
            {
                "action": action,
                "label": label,
                "url": reverse(f"{self.admin_site.name}:weft_django_workflow_act", args=[quote(workflow.pk), action])
                + (f"?run_id={workflow.run_id}" if action == "cancel" else ""),
                "method": "get" if action in ("cancel", "signal", "purge") else "post",
                "run_id": str(workflow.run_id),  # the run shown: a transition refuses if another is current
            }
            for action, label, allowed in possible
            if allowed and self._has_weft_permission(request, action)
        ]

    # -- custom URLs ---------------------------------------------------------------------------
    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("ownership/", wrap(self.ownership_view), name="weft_django_workflow_ownership"),
            path("terminal/", wrap(self.terminal_view), name="weft_django_workflow_terminal"),
            path("bulk/", wrap(self.bulk_view), name="weft_django_workflow_bulk"),
            path("queues/", wrap(self.queues_view), name="weft_django_workflow_queues"),
            path("<path:object_id>/act/<str:action>/", wrap(self.object_action_view), name="weft_django_workflow_act"),
            *super().get_urls(),
        ]

    def ownership_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return views.ownership(self, request)

    def bulk_view(self, request: HttpRequest) -> HttpResponse:
        """Cancel, retry or purge by filter, after a confirmation count (admin/visibility.py)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return visibility.bulk_view(self, request)

    def terminal_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return views.terminal_states(self, request)

    def queues_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return views.queues_page(self, request)

    def object_action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """One action on one workflow, from its change page. Changes happen on POST only; cancel,
        signal and purge show their confirmation or form on GET."""
        if action not in actions.PERMISSION_OF:
            raise Http404(f"No workflow action {action!r}.")
        if not self._has_weft_permission(request, action):
            raise PermissionDenied
        workflow_id = unquote(object_id)
        try:
            validate_workflow_id(workflow_id)  # a NUL or control character: no such workflow, no query
        except InvalidArgumentError:
            raise Http404("No workflow has this id.") from None
        change_url = reverse(f"{self.admin_site.name}:weft_django_workflow_change", args=[quote(workflow_id)])
        if action == "signal":
            form = actions.SignalForm(request.POST if request.method == "POST" else None)
            if request.method == "POST" and form.is_valid():
                actions.send_signals(self, request, [workflow_id], form)
                return HttpResponseRedirect(change_url)
            return actions.signal_form_response(self, request, form, [workflow_id], action_field=False)
        if action == "purge":
            if request.method == "POST":
                # the run the confirmation listed: one started over it meanwhile is not purged unseen
                run_id = request.POST.get("run_id", "").strip() or None
                purged = actions.purge_ids(self, request, [workflow_id], run_id=run_id)
                target = "changelist" if purged else "change"
                args = [] if purged else [quote(workflow_id)]
                return HttpResponseRedirect(reverse(f"{self.admin_site.name}:weft_django_workflow_{target}", args=args))
            return actions.purge_confirmation(self, request, [workflow_id], action_field=False)
        if action == "cancel" and request.method != "POST":
            context = {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "title": f'Cancel workflow "{workflow_id}"?',
                "workflow_id": workflow_id,
                "run_id": request.GET.get("run_id", ""),
                "change_url": change_url,
                "media": self.media,
            }
            return TemplateResponse(request, "admin/weft_django/workflow/cancel.html", context)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        reason = request.POST.get("reason", "").strip() if action == "cancel" else ""
        try:
            validate_reason(reason)  # NUL or a lone surrogate: refused before anything is written
        except InvalidArgumentError as exc:
            self.message_user(request, f"Nothing was cancelled: {exc}", messages.ERROR)
            return HttpResponseRedirect(change_url)
        run_id = request.POST.get("run_id", "").strip() or None  # the run the page showed
        actions.run_transition(
            self, request, action, [workflow_id], reason[: actions.ADMIN_REASON_LENGTH], run_id=run_id
        )
        return HttpResponseRedirect(change_url)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra = dict(extra_context or {})
        extra["weft_links"] = [
            *views.links(self),
            {"label": "Bulk by filter", "url": reverse(f"{self.admin_site.name}:weft_django_workflow_bulk")},
        ]
        response = super().changelist_view(request, extra)
        if isinstance(response, TemplateResponse) and response.context_data and "cl" in response.context_data:
            changelist = response.context_data["cl"]
            try:
                response.render()
            except Exception as exc:
                # Django's date hierarchy turns the oldest and newest created_at into local dates; a
                # row a day from year 1 or 9999 (an odd row) makes that overflow, and one Python cannot
                # represent at all fails their read (DataError on PostgreSQL; on SQLite ValueError,
                # TypeError, ... as Django parses the text). Show the list without the hierarchy
                # rather than an error page; any other error stands.
                odd = isinstance(exc, OverflowError | DataError)
                if not changelist.date_hierarchy or not (odd or unreadable_bounds(changelist.queryset, "created_at")):
                    raise
                changelist.date_hierarchy = None
                self.message_user(request, HIERARCHY_HIDDEN, messages.WARNING)
                response.render()
        return response
