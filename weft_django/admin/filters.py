"""Changelist filters that read the claim table and the status groups."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from ..status import ACTIVE_STATUSES, TERMINAL_STATUSES
from .clocks import claim_now


class OwnershipFilter(admin.SimpleListFilter):
    """owned: an engine holds an unexpired claim; lapsed: the holder's claim expired (an engine will
    take it over, or none is alive); unowned: no engine holds it. Reads the ``owner_engine`` and
    ``claim_expires_at`` annotations of WorkflowAdmin.get_queryset."""

    title = "ownership"
    parameter_name = "ownership"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("owned", "Owned"), ("lapsed", "Lapsed claim"), ("unowned", "Unowned")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "unowned":
            return queryset.filter(owner_engine__isnull=True)
        if value in ("owned", "lapsed"):
            now = claim_now(request)
            expiry = Q(claim_expires_at__lt=now) if value == "lapsed" else Q(claim_expires_at__gte=now)
            return queryset.filter(Q(owner_engine__isnull=False) & expiry)
        return None


class ActivityFilter(admin.SimpleListFilter):
    title = "active or terminal"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "Active (pending, running, suspended)"), ("terminal", "Terminal (ended)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "active":
            return queryset.filter(status__in=list(ACTIVE_STATUSES))
        if self.value() == "terminal":
            return queryset.filter(status__in=list(TERMINAL_STATUSES))
        return None


class ClaimStateFilter(admin.SimpleListFilter):
    """For the claims changelist: held (unexpired), lapsed (held, expired), released (no holder)."""

    title = "claim state"
    parameter_name = "claim"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("held", "Held"), ("lapsed", "Lapsed"), ("released", "Released / never claimed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "released":
            return queryset.filter(engine_id__isnull=True)
        if value == "held":
            return queryset.filter(engine_id__isnull=False, expires_at__gte=claim_now(request))
        if value == "lapsed":
            return queryset.filter(engine_id__isnull=False, expires_at__lt=claim_now(request))
        return None
