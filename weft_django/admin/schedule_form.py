"""The Schedule admin's add and change form: the arguments of ``weft.schedule()``, checked by the same
function it runs (``schedules.validate_schedule``), so a bad argument comes back as a form error with
weft's own message before anything is written. The form never writes the row (admin/schedules.py
saves through the API)."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import schedules
from ..conf import database_alias
from ..exceptions import (
    InvalidScheduleError,
    PayloadNotSerializableError,
    PayloadSizeExceededError,
    WorkflowNotRegisteredError,
)
from ..models import Schedule
from ..registry import registry
from ..status import OverlapPolicy
from .payloads import PayloadInputError, parse_payload

# The library's errors for bad arguments; anything else is a bug and propagates.
INPUT_ERRORS = (InvalidScheduleError, WorkflowNotRegisteredError, PayloadNotSerializableError, PayloadSizeExceededError)
API_FIELDS = ("workflow", "cron", "every", "timezone", "jitter", "args", "kwargs", "overlap", "backfill")
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
        help_text="Delay each fire by a stable amount in [0, jitter), and less than the gap to the next occurrence: "
        'seconds or a duration ("5m"); blank for none.',
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
