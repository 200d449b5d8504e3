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
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import DateTimeField, QuerySet, Value
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import ngettext

from .. import schedules
from ..conf import database_alias
from ..exceptions import (
    InvalidScheduleError,
    PayloadNotSerializableError,
    PayloadSizeExceededError,
    ScheduleNotFoundError,
    WorkflowNotRegisteredError,
)
from ..models import Schedule
from ..registry import registry
from ..status import OverlapPolicy
from .clocks import workflow_now
from .formatting import format_duration, moment, pretty_payload, relative, state_badge
from .payloads import PayloadInputError, parse_payload

# Which model permission each action needs (weft_django.<codename>). Pause, resume and trigger change
# the schedule's state, so they share the model's change permission (no custom one is declared).
CODENAMES = {
    "pause": "change_schedule",
    "resume": "change_schedule",
    "trigger": "change_schedule",
    "delete": "delete_schedule",
}
# The library's errors for bad arguments; anything else is a bug and propagates.
INPUT_ERRORS = (InvalidScheduleError, WorkflowNotRegisteredError, PayloadNotSerializableError, PayloadSizeExceededError)
API_FIELDS = ("workflow", "cron", "every", "timezone", "jitter", "args", "kwargs", "overlap", "backfill")
SHOWN = 5
_NUMBER = re.compile(r"\s*-?\d+(\.\d+)?\s*")


def _number_or_text(text: str) -> int | float | str | None:
    """A duration as typed: blank is None, "30" or "1.5" are seconds, "5m" goes to weft as it is."""
    text = text.strip()
    if not text:
        return None
    if _NUMBER.fullmatch(text):
        number = float(text)
        return int(number) if number.is_integer() else number
    return text


def _error_field(exc: Exception, fields: Any) -> str | None:
    """The form field a library error is about: weft's messages name the argument first ("cron ...",
    "timezone ...") or, for payloads, its path ("args[0] ..."); None for a form-wide error."""
    if isinstance(exc, WorkflowNotRegisteredError):
        return "workflow"
    first = re.split(r"[\s\[.:]", str(exc).lstrip("'\""), maxsplit=1)[0]
    if first in ("args", "kwargs", "input") and isinstance(exc, PayloadNotSerializableError | PayloadSizeExceededError):
        return "args" if first == "input" else first
    return first if first in fields else None


def validate(schedule_id: str, values: dict[str, Any]) -> None:
    """What ``weft.schedule(id=schedule_id, **values)`` checks before writing, run without writing."""
    schedules.validate_schedule(schedule_id, values)


class WorkflowTypeInput(forms.TextInput):
    """A text input that suggests the workflow types registered in this process (a <datalist>)."""

    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None) -> SafeString:
        attrs = {**(attrs or {}), "list": "weft-workflow-types"}
        names = sorted(registry.latest)
        options = format_html_join("", '<option value="{}">', ((n,) for n in names))
        return format_html(
            '{}<datalist id="weft-workflow-types">{}</datalist>', super().render(name, value, attrs, renderer), options
        )


def _textarea() -> forms.Textarea:
    return forms.Textarea(attrs={"rows": 3, "cols": 60, "class": "weft-mono"})


class ScheduleForm(forms.ModelForm):
    """The arguments of ``weft.schedule()``. Never saved as a model form: ``values()`` feeds the API."""

    id = forms.CharField(
        max_length=schedules.MAX_SCHEDULE_ID_LENGTH,
        label="Id",
        help_text="Names the schedule (1-200 characters); its runs are named id@time, e.g. "
        "nightly@2025-01-31T01:30:00Z. Cannot be changed later.",
    )
    workflow = forms.CharField(
        label="Workflow",
        max_length=255,
        widget=WorkflowTypeInput(attrs={"size": 40}),
        help_text="The registered name of the workflow each occurrence starts.",
    )
    cron = forms.CharField(
        label="Cron",
        required=False,
        max_length=255,
        widget=forms.TextInput(attrs={"class": "weft-mono", "placeholder": "30 2 * * *"}),
        help_text='Five fields (minute hour day-of-month month day-of-week) or @daily, @hourly, ...; "H" '
        "hashes the id. Give either a cron or an interval.",
    )
    every = forms.CharField(
        required=False,
        max_length=64,
        label="Every",
        widget=forms.TextInput(attrs={"placeholder": "3600 or 1h"}),
        help_text='The interval: whole seconds ("60") or a duration ("5m", "1h"), at least 1 s.',
    )
    timezone = forms.CharField(
        label="Time zone",
        max_length=schedules.MAX_TIMEZONE_LENGTH,
        initial="UTC",
        help_text='The IANA zone the cron is read in, e.g. "Europe/Berlin".',
    )
    jitter = forms.CharField(
        label="Jitter",
        required=False,
        max_length=64,
        help_text='Delay each fire by a stable amount in [0, jitter): seconds or a duration ("5m"); blank for none.',
    )
    args = forms.CharField(
        label="Args",
        required=False,
        initial="[]",
        widget=_textarea(),
        help_text='A JSON list of positional arguments. Typed values use weft tags, e.g. {"$weft": "decimal", '
        '"v": "1"}.',
    )
    kwargs = forms.CharField(
        label="Kwargs",
        required=False,
        initial="{}",
        widget=_textarea(),
        help_text="A JSON object of keyword arguments.",
    )
    overlap = forms.ChoiceField(
        label="Overlap",
        choices=OverlapPolicy.choices,
        initial=OverlapPolicy.SKIP,
        help_text="What an occurrence does while a run of this schedule is still active.",
    )
    backfill = forms.BooleanField(
        label="Backfill",
        required=False,
        help_text="Fire the occurrences missed while no engine ran (otherwise they are counted).",
    )

    class Meta:
        model = Schedule
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editing = not self.instance._state.adding
        if self.editing:
            self.fields.pop("id", None)  # the primary key: shown read-only, never changed
            row = self.instance
            self.initial.update(
                {
                    "workflow": row.workflow_type,
                    "cron": row.cron or "",
                    "every": "" if row.every is None else str(row.every),
                    "timezone": row.timezone,
                    "jitter": _jitter_text(row.jitter_ms),
                    "args": row.args,
                    "kwargs": row.kwargs,
                    "overlap": row.overlap,
                    "backfill": row.backfill,
                }
            )

    @property
    def schedule_id(self) -> str:
        return str(self.instance.pk) if self.editing else self.cleaned_data["id"]

    def clean_id(self) -> str:
        value: str = self.cleaned_data["id"]
        if Schedule.objects.using(database_alias()).filter(pk=value).exists():
            raise forms.ValidationError(f'A schedule "{value}" already exists; open it to change it.')
        return value

    def _json(self, name: str) -> Any:
        try:
            return parse_payload(self.cleaned_data.get(name), name)
        except PayloadInputError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_args(self) -> Any:
        value = self._json("args")
        return [] if value is None else value

    def clean_kwargs(self) -> Any:
        return self._json("kwargs")

    def clean_cron(self) -> str | None:
        return self.cleaned_data["cron"].strip() or None

    def clean_every(self) -> int | float | str | None:
        return _number_or_text(self.cleaned_data["every"])

    def clean_jitter(self) -> int | float | str | None:
        return _number_or_text(self.cleaned_data["jitter"])

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        if self.errors:
            return data  # fix these first: the library would only repeat them
        try:
            validate(self.schedule_id, self.values())
        except INPUT_ERRORS as exc:
            self.add_error(_error_field(exc, self.fields), str(exc))
        return data

    def _post_clean(self) -> None:
        """No model-instance validation: the row is written by weft.schedule(), never from this form."""

    def values(self) -> dict[str, Any]:
        """The keyword arguments for weft.schedule() / ScheduleHandle.update()."""
        return {name: self.cleaned_data.get(name) for name in API_FIELDS}


def _jitter_text(ms: int) -> str:
    if not ms:
        return ""
    return str(ms // 1000) if ms % 1000 == 0 else f"{ms}ms"


def _every_text(seconds: int) -> str:
    """ "90s", "5m", "2h", "1d": the largest unit that divides the interval."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def spec_summary(row: Schedule) -> str:
    """ "cron 30 2 * * * (Europe/Berlin)" or "every 1h", with the jitter when there is one."""
    text = f"cron {row.cron} ({row.timezone})" if row.cron else f"every {_every_text(row.every or 0)}"
    if row.jitter_ms:
        text += f", jitter < {format_duration(timedelta(milliseconds=row.jitter_ms))}"
    return text


def _names(ids: list[str]) -> str:
    shown = ", ".join(f'"{i}"' for i in ids[:SHOWN])
    return shown + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")


def _who(request: HttpRequest) -> str:
    return request.user.get_username() if request.user.is_authenticated else "?"


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
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
        ("History", {"fields": ("created_at", "updated_at")}),
    )
    info_fields = (
        "id",
        "state_display",
        "next_fires_display",
        "last_fired_display",
        "missed_fire_count",
        "runs_display",
        "created_at",
        "updated_at",
    )

    class Media:
        css = {"all": ("weft_django/admin.css",)}

    @property
    def weft_alias(self) -> str:
        return database_alias()

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        return (
            super()
            .get_queryset(request)
            .using(self.weft_alias)
            .annotate(observed_at=Value(workflow_now(request), output_field=DateTimeField()))
        )

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
        return moment(obj.last_fired_at, short=True)

    def _described(self, obj: Schedule) -> dict[str, Any]:
        cached: dict[str, Any] | None = getattr(obj, "_weft_described", None)
        if cached is None:
            try:
                cached = schedules.ScheduleHandle(obj.pk).describe()
            except ScheduleNotFoundError:
                cached = {"next_fire_times": [], "running_ids": []}
            obj._weft_described = cached  # type: ignore[attr-defined]
        return cached

    @admin.display(description="next fire times (UTC)")
    def next_fires_display(self, obj: Schedule) -> SafeString | str:
        times = self._described(obj)["next_fire_times"]
        if not times:
            return "- (paused)" if obj.paused else "-"
        return format_html_join(", ", "<code>{}</code>", ((t.strftime("%Y-%m-%d %H:%M:%S"),) for t in times))

    @admin.display(description="active runs")
    def runs_display(self, obj: Schedule) -> SafeString | str:
        ids = self._described(obj)["running_ids"]
        if not ids:
            return "-"
        name = f"{self.admin_site.name}:weft_django_workflow_change"
        return format_html_join(", ", '<a href="{}">{}</a>', ((reverse(name, args=[quote(i)]), i) for i in ids))

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
        if object_id is not None:
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
            except (ScheduleNotFoundError, WorkflowNotRegisteredError) as exc:
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
        calls[action](request, [schedule_id])
        if not Schedule.objects.using(self.weft_alias).filter(pk=schedule_id).exists():
            return HttpResponseRedirect(reverse(f"{self.admin_site.name}:weft_django_schedule_changelist"))
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:weft_django_schedule_change", args=[quote(schedule_id)])
        )


def _selected(queryset: QuerySet[Schedule]) -> list[str]:
    return list(queryset.order_by("pk").values_list("pk", flat=True))
