"""The Schedule admin: the only weft model an operator edits, and only through the public API.

The add and change forms validate with the same function ``weft.schedule()`` runs (so a bad cron, an
unknown workflow type, a bad time zone, bad JSON arguments or a negative duration come back as form
errors carrying weft's own message, before anything is written), then save with ``weft.schedule()``
(add) or ``ScheduleHandle.update()`` (change); the form never writes the row. Pause, resume, trigger
and delete call the handle's methods. Engine-owned columns (next fire, last fire, missed count) are
read-only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import DateTimeField, QuerySet, Value
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import ngettext

from .. import schedules
from ..conf import database_alias
from ..exceptions import ScheduleNotFoundError, UnusableScheduleError, WorkflowNotRegisteredError
from ..models import Schedule
from ..store.clock import db_now
from ..store.moments import readable_rows
from .base import GuardedChangelist
from .clocks import workflow_now
from .formatting import format_duration, moment, moment_of, pretty_payload, relative, state_badge
from .readonly import moment_column
from .schedule_display import next_fires_html, runs_html, spec_summary
from .schedule_form import API_FIELDS, INPUT_ERRORS, ScheduleForm, validate  # noqa: F401 - importable from here

# Which model permission each action needs (weft_django.<codename>). Pause, resume and trigger change
# the schedule's state, so they share the model's change permission (no custom one is declared).
CODENAMES = {
    "pause": "change_schedule",
    "resume": "change_schedule",
    "trigger": "change_schedule",
    "delete": "delete_schedule",
}
SHOWN = 5


def _names(ids: list[str]) -> str:
    shown = ", ".join(f'"{i}"' for i in ids[:SHOWN])
    return shown + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")


def _who(request: HttpRequest) -> str:
    return request.user.get_username() if request.user.is_authenticated else "?"


@admin.register(Schedule)
class ScheduleAdmin(GuardedChangelist):
    form = ScheduleForm
    list_display = (
        "id",
        "workflow_type",
        "spec_display",
        "state_display",
        "next_fire_display",
        "last_fired_display",
        "overlap",
        "missed_fire_count",
    )
    list_filter = ("paused", "overlap", ("workflow_type", admin.AllValuesFieldListFilter))
    search_fields = ("id", "workflow_type")
    ordering = ("id",)
    list_per_page = 100
    show_full_result_count = False
    actions = ("pause_schedules", "resume_schedules", "trigger_schedules")  # and the site's delete_selected
    change_form_template = "admin/weft_django/schedule/change_form.html"
    add_fieldsets = (
        (None, {"fields": ("id", "workflow")}),
        ("When", {"fields": ("cron", "every", "timezone", "jitter")}),
        ("Each run", {"fields": ("args", "kwargs", "overlap", "backfill")}),
    )
    change_fieldsets = (
        (None, {"fields": ("id", "state_display", "workflow")}),
        ("When", {"fields": ("cron", "every", "timezone", "jitter")}),
        ("Each run", {"fields": ("args", "kwargs", "overlap", "backfill")}),
        (
            "Firing (kept by the engines)",
            {"fields": ("next_fires_display", "last_fired_display", "missed_fire_count", "runs_display")},
        ),
        ("History", {"fields": ("created_at_display", "updated_at_display")}),
    )
    info_fields = (
        "id",
        "state_display",
        "next_fires_display",
        "last_fired_display",
        "missed_fire_count",
        "runs_display",
        "created_at_display",
        "updated_at_display",
    )

    class Media:
        css = {"all": ("weft_django/admin.css",)}

    @property
    def weft_alias(self) -> str:
        return database_alias()

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        annotated = (
            super()
            .get_queryset(request)
            .using(self.weft_alias)
            .annotate(observed_at=Value(workflow_now(request), output_field=DateTimeField()))
        )
        return readable_rows(annotated)  # a time Python cannot represent (a hand edit): shown marked

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        return self.change_fieldsets if obj is not None else self.add_fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        return self.info_fields if obj is not None else ()

    # -- permissions: the model's own (view, add, change, delete) ------------------------------
    def _has(self, request: HttpRequest, action: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{CODENAMES[action]}")

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "pause")

    def has_trigger_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "trigger")

    # -- columns and read-only fields ----------------------------------------------------------
    @admin.display(description="schedule")
    def spec_display(self, obj: Schedule) -> str:
        return spec_summary(obj)

    @admin.display(description="state", ordering="paused")
    def state_display(self, obj: Schedule) -> SafeString:
        if obj.paused:
            badge = state_badge("stopped", "paused")
            return format_html("{} {}", badge, obj.note) if obj.note else badge
        return state_badge("alive", "active")

    @admin.display(description="next fire", ordering="next_fire_at")
    def next_fire_display(self, obj: Schedule) -> SafeString | str:
        if "next_fire_at" in getattr(obj, "weft_unreadable", {}):
            return moment_of(obj, "next_fire_at")
        if obj.paused or obj.next_fire_at is None:
            return "-"
        now = getattr(obj, "observed_at", None)
        if now is None:
            return moment(obj.next_fire_at, short=True)
        label = relative(obj.next_fire_at, now)
        if obj.next_fire_at < now:
            return format_html(
                '<span class="weft-lapsed" title="{}">overdue {}</span>', obj.next_fire_at.isoformat(), label
            )
        return format_html('<span title="{}">{}</span>', obj.next_fire_at.isoformat(), label)

    @admin.display(description="last fire", ordering="last_fired_at")
    def last_fired_display(self, obj: Schedule) -> SafeString | str:
        return moment_of(obj, "last_fired_at", short=True)

    @admin.display(description="next fire times (UTC)")
    def next_fires_display(self, obj: Schedule) -> SafeString | str:
        obj.unreadable = set(getattr(obj, "weft_unreadable", {}))  # type: ignore[attr-defined]  # read by the timing
        now = getattr(obj, "observed_at", None)
        return next_fires_html(obj, now if now is not None else db_now(self.weft_alias))

    @admin.display(description="active runs")
    def runs_display(self, obj: Schedule) -> SafeString | str:
        return runs_html(obj, self.admin_site.name)

    created_at_display = moment_column("created_at", "created at")
    updated_at_display = moment_column("updated_at", "updated at")

    # Shown when the user may only view (every field read-only): the API's names, readable values.
    @admin.display(description="workflow")
    def workflow(self, obj: Schedule) -> str:
        return obj.workflow_type

    @admin.display(description="jitter")
    def jitter(self, obj: Schedule) -> str:
        return format_duration(timedelta(milliseconds=obj.jitter_ms)) if obj.jitter_ms else "-"

    @admin.display(description="args")
    def args(self, obj: Schedule) -> str:
        return pretty_payload(obj.args)

    @admin.display(description="kwargs")
    def kwargs(self, obj: Schedule) -> str:
        return pretty_payload(obj.kwargs)

    # -- saving and deleting through the API ---------------------------------------------------
    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        values = form.values()
        if change:
            schedules.ScheduleHandle(obj.pk).update(**values)
        else:
            workflow = values.pop("workflow")
            schedules.schedule(workflow, id=form.schedule_id, **values)
            obj.pk = form.schedule_id  # for the log entry and the redirect

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Nothing related to save: the API wrote everything."""

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        with contextlib.suppress(ScheduleNotFoundError):  # deleted meanwhile: what was asked holds
            schedules.ScheduleHandle(obj.pk).delete()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule_id in queryset.order_by("pk").values_list("pk", flat=True):
            with contextlib.suppress(ScheduleNotFoundError):
                schedules.ScheduleHandle(schedule_id).delete()

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra = dict(extra_context or {})
        if object_id is not None and "\x00" not in object_id:  # NUL: no such schedule (get_object says so)
            extra["object_actions"] = self._object_actions(request, unquote(object_id))
        try:
            return super().changeform_view(request, object_id, form_url, extra)
        except ScheduleNotFoundError as exc:  # deleted between the form's validation and its save
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(reverse(f"{self.admin_site.name}:weft_django_schedule_changelist"))

    # -- actions -------------------------------------------------------------------------------
    def _each(
        self, request: HttpRequest, ids: list[str], act: Callable[[schedules.ScheduleHandle], object]
    ) -> tuple[list[str], list[tuple[str, Exception]]]:
        done: list[str] = []
        refused: list[tuple[str, Exception]] = []
        for schedule_id in ids:
            try:
                act(schedules.ScheduleHandle(schedule_id))
            except (ScheduleNotFoundError, WorkflowNotRegisteredError, UnusableScheduleError) as exc:
                refused.append((schedule_id, exc))
            else:
                done.append(schedule_id)
        return done, refused

    def _report(self, request: HttpRequest, verb: str, done: list[str], refused: list[tuple[str, Exception]]) -> None:
        if done:
            text = ngettext(
                "%(verb)s %(count)d schedule: %(ids)s.", "%(verb)s %(count)d schedules: %(ids)s.", len(done)
            )
            self.message_user(request, text % {"verb": verb, "count": len(done), "ids": _names(done)}, messages.SUCCESS)
            for row in Schedule.objects.using(self.weft_alias).filter(pk__in=done):
                self.log_change(request, row, f"{verb} (weft admin action).")
        for schedule_id, exc in refused:
            self.message_user(
                request,
                f'Schedule "{schedule_id}" was not {verb.lower()} ({type(exc).__name__}): {exc}',
                messages.WARNING,
            )

    def pause_ids(self, request: HttpRequest, ids: list[str]) -> None:
        note = f"paused in the Django admin by {_who(request)}"
        self._report(request, "Paused", *self._each(request, ids, lambda h: h.pause(note)))

    def resume_ids(self, request: HttpRequest, ids: list[str]) -> None:
        self._report(request, "Resumed", *self._each(request, ids, lambda h: h.resume()))

    def trigger_ids(self, request: HttpRequest, ids: list[str]) -> None:
        """A run now for each, subject to its overlap policy; says which run started or why none did."""
        started: dict[str, str] = {}

        def trigger(handle: schedules.ScheduleHandle) -> None:
            run = handle.trigger()
            started[handle.id] = "" if run is None else run.id

        done, refused = self._each(request, ids, trigger)
        ran = [i for i in done if started[i]]
        if ran:
            runs = ", ".join(f'"{started[i]}"' for i in ran[:SHOWN]) + (" ..." if len(ran) > SHOWN else "")
            text = ngettext(
                "Triggered %(count)d schedule: %(ids)s; started %(runs)s.",
                "Triggered %(count)d schedules: %(ids)s; started %(runs)s.",
                len(ran),
            )
            self.message_user(request, text % {"count": len(ran), "ids": _names(ran), "runs": runs}, messages.SUCCESS)
            for row in Schedule.objects.using(self.weft_alias).filter(pk__in=ran):
                self.log_change(request, row, f'Triggered: started "{started[row.pk]}" (weft admin action).')
        skipped = [i for i in done if not started[i]]
        if skipped:
            text = ngettext(
                "%(count)d schedule started no run: %(ids)s. Its overlap policy skipped it because a run of it "
                "is still active.",
                "%(count)d schedules started no run: %(ids)s. Their overlap policy skipped them because a run of "
                "each is still active.",
                len(skipped),
            )
            self.message_user(request, text % {"count": len(skipped), "ids": _names(skipped)}, messages.WARNING)
        self._report(request, "Triggered", [], refused)

    @admin.action(permissions=["pause"], description="Pause selected schedules")
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self.pause_ids(request, _selected(queryset))

    @admin.action(permissions=["pause"], description="Resume selected schedules")
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self.resume_ids(request, _selected(queryset))

    @admin.action(permissions=["trigger"], description="Trigger selected schedules now")
    def trigger_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self.trigger_ids(request, _selected(queryset))

    # -- the change page's buttons ---------------------------------------------------------------
    def _object_actions(self, request: HttpRequest, schedule_id: str) -> list[dict[str, str]]:
        row = Schedule.objects.using(self.weft_alias).filter(pk=schedule_id).only("pk", "paused").first()
        if row is None:
            return []
        possible = [
            ("pause", "Pause", not row.paused),
            ("resume", "Resume", row.paused),
            ("trigger", "Trigger now", True),
        ]
        return [
            {
                "action": action,
                "label": label,
                "url": reverse(f"{self.admin_site.name}:weft_django_schedule_act", args=[quote(schedule_id), action]),
            }
            for action, label, shown in possible
            if shown and self._has(request, action)
        ]

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/act/<str:action>/", wrap(self.object_action_view), name="weft_django_schedule_act"),
            *super().get_urls(),
        ]

    def object_action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Pause, resume or trigger one schedule from its page (POST only; delete has Django's own page)."""
        calls = {"pause": self.pause_ids, "resume": self.resume_ids, "trigger": self.trigger_ids}
        if action not in calls:
            raise Http404(f"No schedule action {action!r}.")
        if not self._has(request, action):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        schedule_id = unquote(object_id)
        if "\x00" in schedule_id:  # PostgreSQL refuses it as a parameter; no schedule has it
            raise Http404("No schedule has this id.")
        calls[action](request, [schedule_id])
        if not Schedule.objects.using(self.weft_alias).filter(pk=schedule_id).exists():
            return HttpResponseRedirect(reverse(f"{self.admin_site.name}:weft_django_schedule_changelist"))
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:weft_django_schedule_change", args=[quote(schedule_id)])
        )


def _selected(queryset: QuerySet[Schedule]) -> list[str]:
    return list(queryset.order_by("pk").values_list("pk", flat=True))
