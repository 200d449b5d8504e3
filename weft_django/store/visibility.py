"""Visibility: the search attribute rows (``WorkflowAttribute``) and the queries that find workflows
(list, count, the bulk operations' selection, the admin's attribute filter). ADR 0010.

Attribute rows are written in the transaction of the writes they come with: the engine's fenced
commit (``write_batch``, after the fence), or a start (``write_for_start``). The list query is
keyset-paginated newest first, on ``(created_at, id)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery

from ..models import Workflow, WorkflowAttribute
from .backend import backend
from .moments import readable_values
from .writes import WorkflowWrites

COLUMN_OF_KIND = {
    "str": "str_value",
    "keywords": "str_value",
    "int": "num_value",
    "float": "num_value",
    "bool": "bool_value",
    "datetime": "time_value",
}
OPERATORS = ("eq", "gt", "gte", "lt", "lte", "in", "exists")

# -- writing --------------------------------------------------------------------------------------


def _rows(workflow_id: str, name: str, kind: str, value: Any) -> list[WorkflowAttribute]:
    column = COLUMN_OF_KIND[kind]
    values = list(value) if kind == "keywords" else [value]
    return [
        WorkflowAttribute(workflow_id=workflow_id, name=name, position=i, kind=kind, **{column: item})
        for i, item in enumerate(values)
    ]


def write(values: Mapping[str, Mapping[str, tuple[str, Any] | None]], using: str) -> None:
    """Replace the named attributes of these workflows (workflow id -> name -> (kind, value), None
    clears the name), in the caller's transaction: one DELETE per set of names (per chunk of workflows
    past the database's parameter limit), one INSERT for all (a start_many of 10,000 runs with the
    same attributes: a handful of statements).

    Raises:
        django.db.DatabaseError: a statement failed.
    """
    fresh: list[WorkflowAttribute] = []
    by_names: dict[tuple[str, ...], list[str]] = {}
    for workflow_id, named in values.items():
        if not named:
            continue
        by_names.setdefault(tuple(sorted(named)), []).append(workflow_id)
        for name, checked in named.items():
            if checked is not None:
                fresh.extend(_rows(workflow_id, name, *checked))
    for names, workflow_ids in by_names.items():
        for chunk in backend(using).chunks(workflow_ids, reserved=len(names) + 10):
            WorkflowAttribute.objects.using(using).filter(workflow_id__in=chunk, name__in=names).delete()
    if fresh:
        WorkflowAttribute.objects.using(using).bulk_create(fresh)


def write_batch(batch: list[WorkflowWrites], using: str) -> None:
    """The attribute part of a fenced commit (inside its transaction, after the fence): each
    workflow's ``set_attributes`` calls applied in the order it made them (the last value wins)."""
    merged: dict[str, dict[str, tuple[str, Any] | None]] = {}
    for writes in batch:
        for update in writes.attributes:
            merged.setdefault(writes.workflow_id, {}).update(update)
    if merged:
        write(merged, using)


def has_attributes(batch: list[WorkflowWrites]) -> bool:
    """Whether a batch writes attributes (it then takes the general commit path)."""
    return any(writes.attributes for writes in batch)


ATTRIBUTE_COLUMNS = ("workflow_id", "name", "kind", "str_value", "num_value", "time_value", "bool_value")


def read(
    workflow_ids: Iterable[str], using: str, unreadable: dict[str, dict[str, str]] | None = None
) -> dict[str, dict[str, Any]]:
    """The attributes of these workflows (id -> name -> value; a keyword list as a list), one query
    (per chunk past the database's parameter limit).

    A time a hand edit put out of Python's reach (``store.moments``) reads as None; with ``unreadable``,
    its stored text is added there (workflow id -> ``"attributes.<name>"`` -> text)."""
    found: dict[str, dict[str, Any]] = {}
    attributes = WorkflowAttribute.objects.using(using).order_by("workflow_id", "name", "position")
    rows = (
        row
        for chunk in backend(using).chunks(sorted(set(workflow_ids)))
        for row in readable_values(attributes.filter(workflow_id__in=chunk), ATTRIBUTE_COLUMNS)
    )
    for row in rows:
        workflow_id, name, kind, text, number, moment, flag = (row[column] for column in ATTRIBUTE_COLUMNS)
        if "unreadable" in row and unreadable is not None:
            unreadable.setdefault(workflow_id, {})[f"attributes.{name}"] = row["unreadable"]["time_value"]
        named = found.setdefault(workflow_id, {})
        if kind == "keywords":
            named.setdefault(name, []).append(text)
        elif kind == "str":
            named[name] = text
        elif kind == "int":
            named[name] = int(number or 0)
        elif kind == "float":
            named[name] = float(number or 0)
        elif kind == "bool":
            named[name] = bool(flag)
        else:
            named[name] = moment
    return found


# -- finding ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Condition:
    """One attribute condition: ``name`` ``operator`` ``value`` on the typed ``column``. A keyword list
    matches when any element does; ``exists`` (value True / False) asks whether the name is set."""

    name: str
    operator: str
    column: str
    value: Any


@dataclasses.dataclass(frozen=True)
class Selection:
    """A checked filter (built by ``weft_django.visibility``): every set field must hold."""

    statuses: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    conditions: tuple[Condition, ...] = ()
    created_after: datetime | None = None
    created_before: datetime | None = None
    started_after: datetime | None = None
    started_before: datetime | None = None
    ended_after: datetime | None = None
    ended_before: datetime | None = None
    parent_id: str | None = None
    schedule_id: str | None = None
    id_prefix: str | None = None


def condition_q(condition: Condition, using: str, *, total: int | None = None) -> Any:
    """The condition as an EXISTS over the attribute rows (a range scan of its partial index).
    ``total``: the values the statement's ``in`` lists bind in all (``_in_total``)."""
    rows = WorkflowAttribute.objects.using(using).filter(workflow_id=OuterRef("pk"), name=condition.name)
    column = condition.column
    if condition.operator == "exists":
        # A row is written only for a value (None deletes the name's rows): any row of the name is
        # "set", whichever typed column holds it (two workflows may declare the name with two types).
        return Exists(rows) if condition.value else ~Exists(rows)
    lookup = column if condition.operator == "eq" else f"{column}__{condition.operator}"
    return Exists(rows.filter(**{lookup: _compared(condition, using, total)}))


def _compared(condition: Condition, using: str, total: int | None) -> Any:
    """The value a condition's lookup takes: an ``in`` list longer than one statement binds (its one
    EXISTS cannot go in chunks) is passed as the backend says (``Backend.in_values``), for the
    ``total`` of the statement's ``in`` lists: two lists each within the limit may pass it together."""
    if condition.operator != "in":
        return condition.value
    field = WorkflowAttribute._meta.get_field(condition.column)
    return backend(using).in_values(field, list(condition.value), total=total)


def _in_total(selection: Selection) -> int:
    """The values the selection's ``in`` lists bind in all, each value a parameter."""
    return sum(len(c.value) for c in selection.conditions if c.operator == "in")


def select(selection: Selection, using: str) -> QuerySet[Workflow]:
    """The workflows a selection matches (unordered)."""
    return narrow(Workflow.objects.using(using).all(), selection, using)


def narrow(queryset: QuerySet[Workflow], selection: Selection, using: str) -> QuerySet[Workflow]:
    """``queryset`` (of Workflow) narrowed to the runs a selection matches (the admin's changelist)."""
    fields: dict[str, Any] = {}
    if selection.statuses:
        fields["status__in"] = list(selection.statuses)
    if selection.types:
        fields["workflow_type__in"] = list(selection.types)
    for name, lookup in (
        ("created_after", "created_at__gte"),
        ("created_before", "created_at__lt"),
        ("started_after", "started_at__gte"),
        ("started_before", "started_at__lt"),
        ("ended_after", "finished_at__gte"),
        ("ended_before", "finished_at__lt"),
        ("parent_id", "parent_id"),
        ("schedule_id", "schedule_id"),
        ("id_prefix", "pk__startswith"),
    ):
        value = getattr(selection, name)
        if value is not None:
            fields[lookup] = value
    if fields:
        queryset = queryset.filter(**fields)
    # The comparisons of one attribute are one EXISTS (one range scan of its index, both bounds in
    # the index condition); a keyword list then matches when ONE element meets all of them.
    grouped: dict[tuple[str, str], list[Condition]] = {}
    total = _in_total(selection)
    for condition in selection.conditions:
        if condition.operator == "exists":
            queryset = queryset.filter(condition_q(condition, using))
        else:
            grouped.setdefault((condition.name, condition.column), []).append(condition)
    for (name, column), group in grouped.items():
        rows = WorkflowAttribute.objects.using(using).filter(workflow_id=OuterRef("pk"), name=name)
        lookups = {
            column if c.operator == "eq" else f"{column}__{c.operator}": _compared(c, using, total) for c in group
        }
        if len(lookups) < len(group):  # the same operator twice (eq 1 and eq 2): each its own EXISTS
            for condition in group:
                queryset = queryset.filter(condition_q(condition, using, total=total))
        else:
            queryset = queryset.filter(Exists(rows.filter(**lookups)))
    return queryset


SUMMARY_COLUMNS = (
    "id",
    "run_id",
    "workflow_type",
    "version",
    "status",
    "parent_id",
    "schedule_id",
    "created_at",
    "started_at",
    "finished_at",
    "current_step",
)


def page(
    selection: Selection, after: tuple[datetime | None, str] | None, limit: int, using: str
) -> list[dict[str, Any]]:
    """Up to ``limit`` matching runs, newest first (created_at, then id, descending), after the keyset
    position ``after`` (the last row of the previous page), with their attributes under "attributes".

    A timestamp Python cannot represent (a hand edit) reads as None, the row's "unreadable" naming it
    with its stored text (``store.moments``; an attribute's as ``"attributes.<name>"``). ``after``'s
    time None: that of the row ``after`` names, compared in SQL (the last row of the previous page had
    an unreadable created_at)."""
    queryset = select(selection, using)
    if after is not None:
        created: Any
        created, last_id = after
        if created is None:
            created = Subquery(Workflow.objects.using(using).filter(pk=last_id).values("created_at")[:1])
        queryset = queryset.filter(Q(created_at__lt=created) | Q(created_at=created, pk__lt=last_id))
    rows = list(readable_values(queryset.order_by("-created_at", "-pk"), SUMMARY_COLUMNS)[:limit])
    damaged: dict[str, dict[str, str]] = {}
    attributes = read([row["id"] for row in rows], using, damaged) if rows else {}
    for row in rows:
        row["attributes"] = attributes.get(row["id"], {})
        if row["id"] in damaged:  # an attribute's time Python cannot represent, named as the row's own
            row["unreadable"] = {**row.get("unreadable", {}), **damaged[row["id"]]}
    return rows


def count(selection: Selection, using: str) -> int:
    """How many runs match."""
    return select(selection, using).count()


def _params(selection: Selection, using: str) -> int:
    """About how many parameters the selection's conditions bind (an ``in`` list: one per value, or
    one in all where the backend passes it as one array, ``Backend.in_values``)."""
    each = backend(using).binds_each(_in_total(selection))
    values = sum((len(c.value) if each else 1) if c.operator == "in" else 2 for c in selection.conditions)
    return values + len(selection.statuses) + len(selection.types) + 10


def ids_batch(selection: Selection, statuses: Iterable[str], after: str | None, limit: int, using: str) -> list[str]:
    """The next ``limit`` matching ids (in id order, after ``after``) whose status is in ``statuses``:
    a bulk operation's next batch."""
    queryset = select(selection, using).filter(status__in=list(statuses))
    if after is not None:
        queryset = queryset.filter(pk__gt=after)
    return list(queryset.order_by("pk").values_list("pk", flat=True)[:limit])


def still_selected(selection: Selection, statuses: Iterable[str], workflow_ids: Iterable[str], using: str) -> set[str]:
    """Those of ``workflow_ids`` that the selection still matches with a status in ``statuses``: a bulk
    operation's check under the claims' lock (a run ended and started again since its batch was read
    no longer matches a filter on its attributes, age or run)."""
    queryset = select(selection, using).filter(status__in=list(statuses))
    chunks = backend(using).chunks(sorted(workflow_ids), reserved=_params(selection, using) + 100)
    return {wid for chunk in chunks for wid in queryset.filter(pk__in=chunk).values_list("pk", flat=True)}


__all__ = [
    "COLUMN_OF_KIND",
    "OPERATORS",
    "Condition",
    "Selection",
    "condition_q",
    "count",
    "has_attributes",
    "ids_batch",
    "narrow",
    "page",
    "read",
    "select",
    "still_selected",
    "write",
    "write_batch",
]
