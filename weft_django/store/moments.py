"""Timestamps a hand edit may have put out of Python's reach, read without failing the whole read.

PostgreSQL keeps timestamps from 4713 BC to year 294276 and +-infinity; psycopg raises DataError for
one before year 1 or past year 9999 while converting a result, and that fails every row of it (a
listing, a page of the admin, a report). SQLite keeps any text, and Django's conversion raises
ValueError for a malformed date. The reads of the operators' tools (``weft list`` / ``describe`` /
``queues``, ``list_workflows``, the admin) select such columns through ``Readable``: the value where
the driver can convert it, else NULL, with the stored text (``StoredText``) beside it, so the other
rows read normally and the damaged column is shown marked (``UNREADABLE``) with what it holds.

The condition is the backend's (``Backend.readable_moment_sql``): the year in PostgreSQL's session
time zone, the shape and range of SQLite's text. The engine's own loads keep their ``UnreadableRow``
(store/histories.py): there a damaged run is made stuck.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from django.db import models
from django.db.models import DateTimeField, F, Func, QuerySet, TextField
from django.db.models.query import ModelIterable, ValuesIterable

from .backend import PostgreSQLBackend, backend

UNREADABLE = "unreadable timestamp"
"""How the tools mark a column whose value Python cannot represent."""

_VALUE = "weft_readable_"
_TEXT = "weft_unreadable_"

M = TypeVar("M", bound=models.Model)


class Readable(Func):
    """A timestamp expression's value where the database driver converts it into a Python datetime,
    else NULL (also in an aggregate: ``Readable(Min("created_at"))``)."""

    output_field = DateTimeField()
    _stored_text = False

    def __init__(self, expression: Any) -> None:
        super().__init__(expression)

    def as_sql(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> tuple[str, tuple[Any, ...]]:
        sql, params = compiler.compile(self.get_source_expressions()[0])
        store = backend(connection.alias)
        condition = store.readable_moment_sql
        if self._stored_text:
            template = f"CASE WHEN {{x}} IS NULL OR ({condition}) THEN NULL ELSE {store.moment_text_sql} END"
        else:
            template = f"CASE WHEN {condition} THEN {{x}} ELSE NULL END"
        return template.replace("{x}", f"({sql})"), tuple(params) * template.count("{x}")


class StoredText(Readable):
    """The stored text of a timestamp expression the driver cannot convert (``'infinity'``,
    ``'10000-01-01 00:00:00+00'``, ``'0000-01-01 00:00:00'``), else NULL."""

    output_field = TextField()  # type: ignore[assignment]
    _stored_text = True


def readable(column: str) -> Readable:
    """An ORM expression: the timestamp ``column`` where Python can hold it, else NULL (the readers
    that need such a column only on the side: a Celery worker's outcome, ``result()``, a task's
    ``get_result()``)."""
    return Readable(F(column))


def readable_sql(column: str) -> tuple[str, list[Any]]:
    """``readable`` as PostgreSQL SQL for a SELECT list, with its parameters (none): for the reads
    made outside Django's connection (``result()``'s reader)."""
    return f"CASE WHEN {PostgreSQLBackend.readable_moment_sql.replace('{x}', column)} THEN {column} END", []


def moment_fields(model: type[models.Model]) -> tuple[str, ...]:
    """The names of ``model``'s timestamp columns."""
    return tuple(f.name for f in model._meta.concrete_fields if isinstance(f, DateTimeField))


class _ReadableRows(ModelIterable):
    """Model instances whose timestamp fields hold the guarded values; ``weft_unreadable`` maps each
    damaged field to its stored text (empty for a sound row)."""

    def __iter__(self) -> Iterator[Any]:
        names = moment_fields(self.queryset.model)
        for row in super().__iter__():
            found: dict[str, str] = {}
            values = row.__dict__
            for name in names:
                if _VALUE + name in values:
                    setattr(row, name, values.pop(_VALUE + name))
                    text = values.pop(_TEXT + name)
                    if text is not None:
                        found[name] = text
            row.weft_unreadable = found
            yield row


def readable_rows(queryset: QuerySet[M]) -> QuerySet[M]:
    """``queryset`` whose instances read every timestamp column through ``Readable``: a damaged one is
    None, named with its stored text in the instance's ``weft_unreadable`` dict. Filters, ordering and
    slices still work on the columns as stored. Apply it last (it sets the queryset's iterable)."""
    names = moment_fields(queryset.model)
    guarded = queryset.defer(*names).annotate(
        **{_VALUE + name: Readable(name) for name in names},
        **{_TEXT + name: StoredText(name) for name in names},
    )
    guarded._iterable_class = _ReadableRows
    return guarded


class _ReadableValues(ValuesIterable):
    """The rows of ``readable_values``: its keys in the order asked, ``unreadable`` added when a
    timestamp could not be read."""

    order: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in super().__iter__():
            found = {name[len(_TEXT) :]: row[name] for name in row if name.startswith(_TEXT) and row[name] is not None}
            shown = {name: row[_VALUE + name] if _VALUE + name in row else row[name] for name in self.order}
            if found:
                shown["unreadable"] = found
            yield shown


def readable_values(queryset: QuerySet[Any], names: Sequence[str], moments: Sequence[str] = ()) -> QuerySet[Any]:
    """``queryset.values(*names)`` with the model's timestamp columns among ``names`` (and the
    annotations named in ``moments``) read through ``Readable``: a damaged one is None, and the row
    has ``"unreadable"``, {name: stored text}, then (no such key for a sound row). Slice or order
    it as any values queryset."""
    guarded = set(moment_fields(queryset.model)).intersection(names) | set(moments)
    plain = [name for name in names if name not in guarded]
    expressions: dict[str, Any] = {}
    for name in names:
        if name in guarded:
            expressions[_VALUE + name] = Readable(name)
            expressions[_TEXT + name] = StoredText(name)
    values = queryset.values(*plain, **expressions)
    values._iterable_class = type("ReadableValues", (_ReadableValues,), {"order": tuple(names)})
    return values


def unreadable_bounds(queryset: QuerySet[Any], name: str) -> bool:
    """Whether the earliest or the latest ``name`` of ``queryset`` cannot be read (a hand edit; on
    PostgreSQL every unreadable timestamp is one of them: before year 1 or past year 9999). One
    aggregate, as Django's date hierarchy reads them."""
    bounds = queryset.aggregate(earliest=StoredText(models.Min(name)), latest=StoredText(models.Max(name)))
    return bounds["earliest"] is not None or bounds["latest"] is not None


__all__ = [
    "UNREADABLE",
    "Readable",
    "StoredText",
    "moment_fields",
    "readable_rows",
    "readable_values",
    "unreadable_bounds",
]
