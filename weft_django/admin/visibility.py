"""The admin's visibility tools (issue 19): the fork action ("fork from a step") and the bulk page
(cancel, retry or purge everything a filter selects, confirmed by its count). Both go through the
public API (``weft.fork``, ``weft.bulk_*``) and check the workflow's custom permissions."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ..bulk import APPLIES_TO, bulk_cancel, bulk_count, bulk_purge, bulk_retry
from ..exceptions import BulkCountChangedError, WeftError
from ..forking import fork
from ..models import Workflow
from ..validation import MAX_ID_LENGTH
from ..visibility import parse_where
from .base import WeftModelAdmin

BULK_PERMISSION = {"cancel": "cancel", "retry": "retry", "purge": "purge"}


class ForkForm(forms.Form):
    from_step = forms.IntegerField(min_value=0, help_text="How many recorded steps the new run reuses (0: none).")
    new_id = forms.CharField(required=False, max_length=MAX_ID_LENGTH, help_text="Optional. Default: a new UUID.")


@admin.action(permissions=["retry"], description="Fork the selected workflow from a step…")
def fork_workflow(
    modeladmin: WeftModelAdmin, request: HttpRequest, queryset: QuerySet[Workflow]
) -> TemplateResponse | None:
    """A new run that reuses the first N recorded steps of the one selected workflow (weft.fork)."""
    ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:2])
    if len(ids) != 1:
        modeladmin.message_user(request, "Select exactly one workflow to fork.", messages.WARNING)
        return None
    form = ForkForm(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        try:
            handle = fork(ids[0], from_step=form.cleaned_data["from_step"], new_id=form.cleaned_data["new_id"] or None)
        except WeftError as exc:
            form.add_error(None, f"{type(exc).__name__}: {exc}")
        else:
            modeladmin.message_user(
                request, f'Forked "{ids[0]}" at step {form.cleaned_data["from_step"]}: "{handle.id}".', messages.SUCCESS
            )
            return None
    context = {
        **modeladmin.admin_site.each_context(request),
        "opts": modeladmin.model._meta,
        "title": f'Fork "{ids[0]}" from a step',
        "form": form,
        "ids": ids,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "media": modeladmin.media,
    }
    return TemplateResponse(request, "admin/weft_django/workflow/fork.html", context)


class BulkForm(forms.Form):
    operation = forms.ChoiceField(choices=[(name, name.capitalize()) for name in sorted(APPLIES_TO)])
    where = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5, "cols": 60, "class": "weft-mono"}),
        help_text="One filter per line, KEY=VALUE: status=failed, workflow_type=orders.ship, customer=acme, "
        "amount__gte=10, started_after=2026-01-01T00:00Z.",
    )
    reason = forms.CharField(required=False, max_length=500, help_text="Cancel only: stored as each run's reason.")
    expected_count = forms.IntegerField(required=False, widget=forms.HiddenInput)

    def filters(self) -> dict[str, Any]:
        return parse_where([line.strip() for line in self.cleaned_data["where"].splitlines() if line.strip()])


def bulk_view(modeladmin: WeftModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: the form. POST without a count: the count to confirm. POST with the count: the operation
    (refused, nothing changed, when the count moved meanwhile)."""
    form = BulkForm(request.POST or None, initial={"where": request.GET.get("where", "")})
    count: int | None = None
    stale = ""
    if request.method == "POST" and form.is_valid():
        operation = form.cleaned_data["operation"]
        if not getattr(modeladmin, f"has_{BULK_PERMISSION[operation]}_permission")(request):
            raise PermissionDenied
        try:
            filters = form.filters()
            confirmed = form.cleaned_data["expected_count"]
            if confirmed is None or "recount" in request.POST:
                count = bulk_count(operation, **filters)
            else:
                who = request.user.get_username() if request.user.is_authenticated else "?"
                reason = f"cancelled in the Django admin by {who}" + (
                    f": {form.cleaned_data['reason']}" if form.cleaned_data["reason"] else ""
                )
                if operation == "cancel":
                    result = bulk_cancel(expected_count=confirmed, reason=reason, **filters)
                else:
                    result = (bulk_retry if operation == "retry" else bulk_purge)(expected_count=confirmed, **filters)
                skipped = f"; {len(result.skipped)} skipped (changed meanwhile)" if result.skipped else ""
                modeladmin.message_user(
                    request,
                    f"Bulk {operation}: {result.changed} of {result.matched} workflow(s){skipped}.",
                    messages.SUCCESS,
                )
                for workflow_id, message in list(result.errors.items())[:20]:
                    modeladmin.message_user(request, f"{workflow_id} not changed: {message}", messages.WARNING)
                if len(result.errors) > 20:
                    modeladmin.message_user(
                        request, f"{len(result.errors) - 20} more workflow(s) not changed.", messages.WARNING
                    )
                return HttpResponseRedirect(reverse(f"{modeladmin.admin_site.name}:weft_django_workflow_changelist"))
        except BulkCountChangedError as exc:
            stale = str(exc)
            count = exc.actual
        except WeftError as exc:
            form.add_error(None, f"{type(exc).__name__}: {exc}")
    if count is not None:
        data = {key: form.data.get(key, "") for key in ("operation", "where", "reason")}
        data["expected_count"] = str(count)
        form = BulkForm(data)
        form.is_valid()
    context = {
        **modeladmin.admin_site.each_context(request),
        "opts": modeladmin.model._meta,
        "title": "Bulk operation by filter",
        "form": form,
        "count": count,
        "stale": stale,
        "media": modeladmin.media,
    }
    return TemplateResponse(request, "admin/weft_django/workflow/bulk.html", context)


__all__ = ["BulkForm", "ForkForm", "bulk_view", "fork_workflow"]
