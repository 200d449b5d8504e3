"""Admin actions on workflows. Each one goes through the public API (the client's handle methods,
``weft.signal``, ``transitions.purge``), checks its custom permission, and reports every success and
every typed refusal with ``message_user``. Engine-owned rows are never written here."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import ngettext

from .. import client, transitions
from ..exceptions import InvalidArgumentError, WorkflowNotFoundError, WorkflowStateError, WorkflowTerminalError
from ..models import Workflow
from ..status import TERMINAL_STATUSES
from ..store.backend import backend
from ..validation import validate_reason
from .base import WeftModelAdmin
from .payloads import PayloadInputError, parse_payload

# The Workflow model's custom permissions (models.py Meta.permissions), by action.
PERMISSION_OF = {
    "cancel": "cancel",
    "suspend": "cancel",
    "resume": "cancel",
    "retry": "retry",
    "signal": "signal",
    "purge": "purge",
}
CODENAMES = {
    "cancel": "cancel_workflow",
    "retry": "retry_workflow",
    "signal": "signal_workflow",
    "purge": "purge_workflow",
}
# InvalidArgumentError: a cancel reason or signal refused by weft_django.validation (nothing written).
REFUSALS = (WorkflowTerminalError, WorkflowStateError, WorkflowNotFoundError, InvalidArgumentError)
SHOWN_FAILURES = 5
# The cancel form's reason is cut here, so "cancelled in the Django admin by <user>: <reason>" stays
# within validation.MAX_REASON_LENGTH (Django user names are at most 150 characters).
ADMIN_REASON_LENGTH = 500


@dataclass
class Outcome:
    done: list[str] = field(default_factory=list)
    refused: list[tuple[str, Exception]] = field(default_factory=list)


def apply_each(ids: Iterable[str], act: Callable[[str], object]) -> Outcome:
    """Run ``act`` for each id; typed refusals are collected, anything else propagates."""
    outcome = Outcome()
    for workflow_id in ids:
        try:
            act(workflow_id)
        except REFUSALS as exc:
            outcome.refused.append((workflow_id, exc))
        else:
            outcome.done.append(workflow_id)
    return outcome


def _ids(ids: list[str]) -> str:
    shown = ", ".join(f'"{i}"' for i in ids[:SHOWN_FAILURES])
    return shown + (f" and {len(ids) - SHOWN_FAILURES} more" if len(ids) > SHOWN_FAILURES else "")


def report(
    modeladmin: admin.ModelAdmin[Any],
    request: HttpRequest,
    outcome: Outcome,
    done: str,
    failed: str,
    refusal_level: int = messages.WARNING,
) -> None:
    """One success message and one message per refusal type (a warning unless ``refusal_level``
    says otherwise), with plurals.

    ``done`` is a past tense ("Cancelled"), ``failed`` a participle ("cancelled")."""
    if outcome.done:
        count = len(outcome.done)
        text = ngettext("%(verb)s %(count)d workflow: %(ids)s.", "%(verb)s %(count)d workflows: %(ids)s.", count)
        modeladmin.message_user(
            request, text % {"verb": done, "count": count, "ids": _ids(outcome.done)}, messages.SUCCESS
        )
    by_type: dict[str, list[tuple[str, Exception]]] = {}
    for workflow_id, exc in outcome.refused:
        by_type.setdefault(type(exc).__name__, []).append((workflow_id, exc))
    for kind, refusals in by_type.items():
        count = len(refusals)
        text = ngettext(
            "%(count)d workflow was not %(verb)s (%(kind)s): %(why)s",
            "%(count)d workflows were not %(verb)s (%(kind)s): %(why)s",
            count,
        )
        why = " ".join(str(exc) for _, exc in refusals[:SHOWN_FAILURES])
        if count > SHOWN_FAILURES:
            why += f" (and {count - SHOWN_FAILURES} more)"
        values = {"count": count, "verb": failed, "kind": kind, "why": why}
        modeladmin.message_user(request, text % values, refusal_level)


def by_ids(alias: str, ids: Iterable[str]) -> Iterator[QuerySet[Workflow]]:
    """The rows of ``ids``, one queryset per chunk of the database's parameter limit (``Backend.chunks``):
    "Select all" of a long list selects every id, and Django sends a ``pk__in`` as one statement."""
    rows = Workflow.objects.using(alias)
    for chunk in backend(alias).chunks(ids):
        yield rows.filter(pk__in=chunk)


def _log(modeladmin: WeftModelAdmin, request: HttpRequest, ids: list[str], message: str) -> None:
    """Record what was done in the admin's history (LogEntry), like an edit would be."""
    for rows in by_ids(modeladmin.weft_alias, ids):
        for workflow in rows.only("pk", "workflow_type", "status"):
            modeladmin.log_change(request, workflow, message)


def _selected_ids(queryset: QuerySet[Workflow]) -> list[str]:
    return list(queryset.order_by("pk").values_list("pk", flat=True))


def run_transition(
    modeladmin: WeftModelAdmin,
    request: HttpRequest,
    action: str,
    ids: list[str],
    reason: str = "",
    *,
    run_id: str | None = None,
) -> Outcome:
    """cancel / suspend / resume / retry ``ids`` through their handles and report. A cancel records
    who cancelled (and why, when given) as the run's cancel reason.

    ``run_id`` (a workflow's page: the run it showed) makes the transition refuse, under the claim's
    lock, when another run is current now (it continued as new meanwhile): an error message, nothing
    changed. The list's actions carry only ids and act on whatever run is current."""
    who = request.user.get_username() if request.user.is_authenticated else "?"
    why = f"cancelled in the Django admin by {who}" + (f": {reason}" if reason else "")
    calls: dict[str, Callable[[str], object]] = {
        "cancel": lambda i: client.get_handle(i).cancel(why),
        "suspend": lambda i: client.get_handle(i).suspend(),
        "resume": lambda i: client.get_handle(i).resume(),
        "retry": lambda i: client.get_handle(i).retry(),
    }
    if run_id is not None:
        alias = modeladmin.weft_alias
        calls = {
            "cancel": lambda i: transitions.cancel(i, validate_reason(why), using=alias, run_id=run_id),
            "suspend": lambda i: transitions.suspend(i, using=alias, run_id=run_id),
            "resume": lambda i: transitions.resume(i, using=alias, run_id=run_id),
            "retry": lambda i: transitions.retry(i, using=alias, run_id=run_id),
        }
    words = {
        "cancel": ("Cancelled", "cancelled"),
        "suspend": ("Suspended", "suspended"),
        "resume": ("Resumed", "resumed"),
        "retry": ("Retried", "retried"),
    }
    outcome = apply_each(ids, calls[action])
    report(modeladmin, request, outcome, *words[action], messages.ERROR if run_id is not None else messages.WARNING)
    _log(modeladmin, request, outcome.done, f"{words[action][0]} (weft admin action).")
    return outcome


@admin.action(permissions=["cancel"], description="Cancel selected workflows")
def cancel_workflows(modeladmin: WeftModelAdmin, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
    run_transition(modeladmin, request, "cancel", _selected_ids(queryset))


@admin.action(permissions=["cancel"], description="Suspend selected workflows")
def suspend_workflows(modeladmin: WeftModelAdmin, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
    run_transition(modeladmin, request, "suspend", _selected_ids(queryset))


@admin.action(permissions=["cancel"], description="Resume selected workflows")
def resume_workflows(modeladmin: WeftModelAdmin, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
    run_transition(modeladmin, request, "resume", _selected_ids(queryset))


@admin.action(permissions=["retry"], description="Retry selected failed workflows from their checkpoint")
def retry_workflows(modeladmin: WeftModelAdmin, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
    run_transition(modeladmin, request, "retry", _selected_ids(queryset))


class SignalForm(forms.Form):
    name = forms.CharField(max_length=client.MAX_NAME_LENGTH, help_text="The signal name the workflow waits for.")
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 80, "class": "weft-mono"}),
        help_text='JSON (empty means null). Typed values use weft tags, e.g. {"$weft": "decimal", "v": "12.00"}.',
    )
    signal_id = forms.CharField(
        required=False,
        max_length=client.MAX_KEY_LENGTH,
        help_text="Optional. A signal id already sent to the same run is ignored (safe to resend).",
    )

    def clean_payload(self) -> Any:
        try:
            return parse_payload(self.cleaned_data.get("payload"), "payload")
        except PayloadInputError as exc:
            raise forms.ValidationError(str(exc)) from None


def signal_form_response(
    modeladmin: WeftModelAdmin, request: HttpRequest, form: SignalForm, ids: list[str], *, action_field: bool
) -> TemplateResponse:
    context = {
        **modeladmin.admin_site.each_context(request),
        "opts": modeladmin.model._meta,
        "title": ngettext("Send a signal to %(count)d workflow", "Send a signal to %(count)d workflows", len(ids))
        % {"count": len(ids)},
        "form": form,
        "ids": ids,
        "action_field": action_field,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "media": modeladmin.media + form.media,
    }
    return TemplateResponse(request, "admin/weft_django/workflow/signal.html", context)


def send_signals(modeladmin: WeftModelAdmin, request: HttpRequest, ids: list[str], form: SignalForm) -> Outcome:
    data = form.cleaned_data
    outcome = apply_each(
        ids, lambda i: client.signal(i, data["name"], data["payload"], signal_id=data["signal_id"] or None)
    )
    report(modeladmin, request, outcome, f'Sent signal "{data["name"]}" to', "signalled")
    _log(modeladmin, request, outcome.done, f'Sent signal "{data["name"]}" (weft admin action).')
    return outcome


@admin.action(permissions=["signal"], description="Send a signal to selected workflows…")
def signal_workflows(
    modeladmin: WeftModelAdmin, request: HttpRequest, queryset: QuerySet[Workflow]
) -> TemplateResponse | None:
    ids = _selected_ids(queryset)
    if "apply" in request.POST:
        form = SignalForm(request.POST)
        if form.is_valid():
            send_signals(modeladmin, request, ids, form)
            return None
    else:
        form = SignalForm()
    return signal_form_response(modeladmin, request, form, ids, action_field=True)


def purge_confirmation(
    modeladmin: WeftModelAdmin, request: HttpRequest, ids: list[str], *, action_field: bool
) -> TemplateResponse:
    rows = [
        row
        for chunk in by_ids(modeladmin.weft_alias, ids)
        for row in chunk.order_by("pk").values("id", "run_id", "workflow_type", "status", "finished_at")
    ]
    context = {
        **modeladmin.admin_site.each_context(request),
        "opts": modeladmin.model._meta,
        "title": "Purge terminal workflows",
        "purgeable": [row for row in rows if row["status"] in TERMINAL_STATUSES],
        "active": [row for row in rows if row["status"] not in TERMINAL_STATUSES],
        "action_field": action_field,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "media": modeladmin.media,
    }
    return TemplateResponse(request, "admin/weft_django/workflow/purge.html", context)


def purge_ids(modeladmin: WeftModelAdmin, request: HttpRequest, ids: list[str], *, run_id: str | None = None) -> int:
    """Purge the terminal ones among ``ids``; active ones are left alone and reported, and so is one
    that became active (started again) after the statuses were read: each is checked under its
    claim's lock (``transitions.purge_terminal``), the others are purged all the same.

    ``run_id`` (a workflow's page: the run its confirmation showed) purges only while that run is
    current: a run started over it meanwhile, never seen, is left and reported as an error."""
    alias = modeladmin.weft_alias
    statuses = {pk: status for rows in by_ids(alias, ids) for pk, status in rows.values_list("pk", "status")}
    terminal = [i for i in ids if statuses.get(i) in TERMINAL_STATUSES]
    purged = transitions.purge_terminal(terminal, using=alias, matching=_of_run(alias, run_id)) if terminal else 0
    left = {pk: status for rows in by_ids(alias, terminal) for pk, status in rows.values_list("pk", "status")}
    active = [i for i in ids if (i in statuses and i not in terminal) or left.get(i) not in (None, *TERMINAL_STATUSES)]
    if purged:
        text = ngettext("Purged %(count)d terminal workflow.", "Purged %(count)d terminal workflows.", purged)
        modeladmin.message_user(request, text % {"count": purged}, messages.SUCCESS)
    if active:
        text = ngettext(
            "%(count)d workflow was not purged because it is still active: %(ids)s. Cancel it first.",
            "%(count)d workflows were not purged because they are still active: %(ids)s. Cancel them first.",
            len(active),
        )
        modeladmin.message_user(request, text % {"count": len(active), "ids": _ids(active)}, messages.WARNING)
    other_run = [i for i in terminal if left.get(i) in TERMINAL_STATUSES]
    if other_run:  # only with run_id: another finished run is current now
        modeladmin.message_user(
            request,
            f"Nothing was purged: run {run_id}, the one this page showed, is no longer the current run of "
            f"{_ids(other_run)} (it was started again meanwhile). Look at the current run first, then purge "
            f"again if it still applies.",
            messages.ERROR,
        )
    if not purged and not active and not other_run:
        modeladmin.message_user(
            request, "Nothing was purged: the selected workflows no longer exist.", messages.WARNING
        )
    return purged


def _of_run(alias: str, run_id: str | None) -> Callable[[list[str]], set[str]] | None:
    """The purge's check under the lock: those of the ids whose current run is ``run_id`` (None: all)."""
    if run_id is None:
        return None
    try:
        wanted = uuid.UUID(run_id)
    except ValueError:  # not a run id at all: no run is that one
        return lambda locked: set()
    return lambda locked: {
        pk for rows in by_ids(alias, locked) for pk in rows.filter(run_id=wanted).values_list("pk", flat=True)
    }


@admin.action(permissions=["purge"], description="Purge selected terminal workflows…")
def purge_workflows(
    modeladmin: WeftModelAdmin, request: HttpRequest, queryset: QuerySet[Workflow]
) -> TemplateResponse | None:
    ids = _selected_ids(queryset)
    if request.POST.get("post") == "yes":
        purge_ids(modeladmin, request, ids)
        return None
    return purge_confirmation(modeladmin, request, ids, action_field=True)


ACTIONS = [cancel_workflows, suspend_workflows, resume_workflows, retry_workflows, signal_workflows, purge_workflows]
