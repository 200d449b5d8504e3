"""Changelist filters that read the claim table and the status groups, and the visibility filters
(search attributes, schedule, parent) with the search box's ``KEY=VALUE`` filters (issue 19)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from ..conf import database_alias
from ..exceptions import InvalidFilterError
from ..models import Schedule
from ..registry import declared_attributes
from ..status import ACTIVE_STATUSES, TERMINAL_STATUSES
from ..store.claims import lapsed
from ..store.visibility import narrow
from ..visibility import parse_where, selection
from .clocks import claim_now, claim_ttl


def _lapsed(request: HttpRequest, *, expires: str, engine: str) -> Q:
    """Held claims that lapsed: expired, or their holder silent for longer than the TTL (ADR 0014)."""
    return lapsed(database_alias(), claim_now(request), claim_ttl(request), expires=expires, engine=engine)


class OwnershipFilter(admin.SimpleListFilter):
    """owned: an engine holds a claim that has not lapsed; lapsed: the claim expired or its holder has
    been silent for longer than the TTL (an engine will take it over, or none is alive); unowned: no
    engine holds it. Reads the ``owner_engine`` annotation and the ``claim_expiry_stored`` alias (the
    expiry as stored, one Python cannot represent included) of WorkflowAdmin.get_queryset."""

    title = "ownership"
    parameter_name = "ownership"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("owned", "Owned"), ("lapsed", "Lapsed claim"), ("unowned", "Unowned")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "unowned":
            return queryset.filter(owner_engine__isnull=True)
        if value in ("owned", "lapsed"):
            gone = _lapsed(request, expires="claim_expiry_stored", engine="owner_engine")
            return queryset.filter(gone if value == "lapsed" else Q(owner_engine__isnull=False) & ~gone)
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
    """For the claims changelist: held (not lapsed), lapsed (held, expired or its holder silent for
    longer than the TTL), released (no holder)."""

    title = "claim state"
    parameter_name = "claim"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("held", "Held"), ("lapsed", "Lapsed"), ("released", "Released / never claimed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "released":
            return queryset.filter(engine_id__isnull=True)
        if value in ("held", "lapsed"):
            gone = _lapsed(request, expires="expires_at", engine="engine_id")
            return queryset.filter(gone if value == "lapsed" else Q(engine_id__isnull=False) & ~gone)
        return None


# -- visibility (issue 19): search attributes, schedule, parent -------------------------------------


class AttributeFilter(admin.SimpleListFilter):
    """By search attribute: the lookups are "<name> is set" for every declared attribute; the URL
    also takes any ``?attribute=<name>[__op]=<value>`` (the form of ``weft list --where``), e.g.
    ``?attribute=customer%3Dacme``. A bad one shows an error message and filters nothing out."""

    title = "search attribute"
    parameter_name = "attribute"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(f"{name}__exists=true", f"{name} is set") for name in sorted(declared_attributes())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if not value:
            return None
        try:
            chosen = selection(**parse_where([value]))
        except InvalidFilterError as exc:
            messages.error(request, f"Search attribute filter ignored: {exc}")
            return None
        return narrow(queryset, chosen, queryset.db)


class ScheduleFilter(admin.SimpleListFilter):
    """Runs of one schedule (the schedules' ids: a small table), or runs no schedule started."""

    title = "schedule"
    parameter_name = "schedule"
    NONE = "-"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        ids = Schedule.objects.using(queryset_alias(model_admin)).order_by("pk").values_list("pk", flat=True)[:100]
        return [(self.NONE, "Not from a schedule"), *((pk, pk) for pk in ids)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == self.NONE:
            return queryset.filter(schedule_id__isnull=True)
        return queryset.filter(schedule_id=value) if value else None


class ParentFilter(admin.SimpleListFilter):
    """Top-level runs or children; ``?parent=<id>`` lists one workflow's children."""

    title = "parent"
    parameter_name = "parent"
    TOP, CHILD = "-", "+"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(self.TOP, "Top-level (no parent)"), (self.CHILD, "Children (have a parent)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == self.TOP:
            return queryset.filter(parent_id__isnull=True)
        if value == self.CHILD:
            return queryset.filter(parent_id__isnull=False)
        return queryset.filter(parent_id=value) if value else None


def queryset_alias(model_admin: Any) -> str:
    return str(getattr(model_admin, "weft_alias", "default"))


def search_by_attributes(request: HttpRequest, queryset: QuerySet[Any], term: str) -> tuple[QuerySet[Any], str]:
    """The search box's ``KEY=VALUE`` words (``customer=acme amount__gte=10 status=failed``) as
    ``list_workflows`` filters; returns the narrowed queryset and the words left for the id search.
    A bad filter is reported and nothing is filtered by it."""
    wheres = [word for word in term.split() if "=" in word]
    rest = " ".join(word for word in term.split() if "=" not in word)
    if not wheres:
        return queryset, term
    try:
        chosen = selection(**parse_where(wheres))
    except InvalidFilterError as exc:
        messages.error(request, f"Search filter ignored: {exc}")
        return queryset, rest
    return narrow(queryset, chosen, queryset.db), rest
