"""Finding workflows from code: ``list_workflows`` / ``count_workflows`` (and their async twins).

Filters are keyword arguments, Django style; every given one must hold (AND). ``attributes`` maps
``name`` or ``name__op`` (op: ``eq``, ``gt``, ``gte``, ``lt``, ``lte``, ``in``, ``exists``) to a
value of the attribute's declared type; a keyword list matches when any element does. Pages are
newest first (created_at, then id) and keyset-paginated: pass the page's ``next_cursor`` back as
``cursor``. Bad filters raise InvalidFilterError before any query. The SQL is in store/visibility.py.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async

from .client.common import _status
from .client.handles import WorkflowHandle
from .codec import is_storable
from .conf import database_alias
from .exceptions import InvalidFilterError
from .registry import WorkflowDefinition, declared_attributes
from .status import WorkflowStatus
from .store import visibility
from .store.visibility import COLUMN_OF_KIND, Condition, Selection
from .validation import MAX_ID_LENGTH

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_RANGE_OPERATORS = ("gt", "gte", "lt", "lte")
_FILTERS = (
    "status",
    "workflow_type",
    "attributes",
    "created_after",
    "created_before",
    "started_after",
    "started_before",
    "ended_after",
    "ended_before",
    "parent_id",
    "schedule_id",
    "id_prefix",
)
FILTER_NAMES = _FILTERS


@dataclasses.dataclass(frozen=True)
class WorkflowSummary:
    """One workflow as ``list_workflows`` returns it (its latest run); ``handle`` acts on it."""

    id: str
    run_id: str
    workflow_type: str
    version: str
    status: WorkflowStatus | str  # the stored text for a status weft does not know (an odd row)
    parent_id: str | None
    schedule_id: str | None
    created_at: datetime | None  # None only when ``unreadable`` names it
    started_at: datetime | None
    finished_at: datetime | None
    current_step: str
    attributes: dict[str, Any]
    # The timestamps the row holds but Python cannot represent (a hand edit: before year 1, past year
    # 9999, 'infinity'), by field, with the stored text; they read as None. Empty for a sound row.
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def handle(self) -> WorkflowHandle:
        """The ``WorkflowHandle`` of this workflow."""
        return WorkflowHandle(self.id)


@dataclasses.dataclass(frozen=True)
class WorkflowPage:
    """A page of summaries, and the cursor of the next page (None: this was the last)."""

    workflows: list[WorkflowSummary]
    next_cursor: str | None

    def __iter__(self) -> Iterator[WorkflowSummary]:
        return iter(self.workflows)

    def __len__(self) -> int:
        return len(self.workflows)


def selection(**filters: Any) -> Selection:
    """Check filters (the keyword arguments of ``list_workflows``) and return the store's selection.

    Raises:
        InvalidFilterError: an unknown filter, a bad value, or an attribute no registered workflow declares.
    """
    unknown = sorted(set(filters) - set(_FILTERS))
    if unknown:
        raise InvalidFilterError(f"Unknown filter(s): {', '.join(unknown)}. Filters: {', '.join(_FILTERS)}.")
    moments = {
        name: _moment(filters.get(name), name)
        for name in (
            "created_after",
            "created_before",
            "started_after",
            "started_before",
            "ended_after",
            "ended_before",
        )
    }
    return Selection(
        statuses=_statuses(filters.get("status")),
        types=_types(filters.get("workflow_type")),
        conditions=_conditions(filters.get("attributes")),
        parent_id=_text(filters.get("parent_id"), "parent_id"),
        schedule_id=_text(filters.get("schedule_id"), "schedule_id"),
        id_prefix=_text(filters.get("id_prefix"), "id_prefix"),
        **moments,
    )


def _statuses(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list | tuple | set | frozenset) or not values:
        raise InvalidFilterError(f"status must be a status or a non-empty list of them (got {value!r:.60}).")
    known = {choice.value for choice in WorkflowStatus}
    bad = [v for v in values if v not in known]
    if bad:
        raise InvalidFilterError(f"Unknown status {bad[0]!r}; one of: {', '.join(sorted(known))}.")
    return tuple(sorted(str(v) for v in values))


def _types(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    values = [value] if isinstance(value, str | WorkflowDefinition) or callable(value) else value
    if not isinstance(values, list | tuple | set | frozenset) or not values:
        raise InvalidFilterError(f"workflow_type must be a name or a non-empty list of names (got {value!r:.60}).")
    names = []
    for item in values:
        definition = getattr(item, "__weft_workflow__", item)
        name = definition.name if isinstance(definition, WorkflowDefinition) else item
        names.append(_text(name, "workflow_type"))
    return tuple(sorted(set(names)))


def _text(value: Any, name: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH or not is_storable(value):
        raise InvalidFilterError(
            f"{name} must be a non-empty string of at most {MAX_ID_LENGTH} characters, without NUL or a lone surrogate."
        )
    return value


def _in_range(value: datetime) -> bool:
    """Whether an aware datetime's UTC instant is inside years 1-9999 (SQLite's adapter converts it to
    UTC; outside, that conversion overflows)."""
    try:
        value.astimezone(UTC)
    except OverflowError:
        return False
    return True


def _moment(value: Any, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidFilterError(f"{name} must be an aware datetime, e.g. timezone.now() (got {value!r:.60}).")
    if not _in_range(value):
        raise InvalidFilterError(f"{name} is {value.isoformat()}, outside years 1-9999 in UTC.")
    return value


def _conditions(value: Any) -> tuple[Condition, ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise InvalidFilterError('attributes must be a dict such as {"customer": "acme", "amount__gte": 10}.')
    declared = declared_attributes()
    out = []
    for key, wanted in value.items():
        if not isinstance(key, str):
            raise InvalidFilterError(f"attribute filter keys are strings (got {key!r:.60}).")
        name, _, operator = key.partition("__")
        operator = operator or "eq"
        if operator not in visibility.OPERATORS:
            raise InvalidFilterError(
                f'attribute filter "{key}": unknown operator "{operator}"; '
                f"use one of {', '.join(visibility.OPERATORS)}."
            )
        kinds = declared.get(name)
        if not kinds:
            known = ", ".join(sorted(declared)) or "none"
            raise InvalidFilterError(
                f'attribute filter "{key}": no registered workflow declares "{name}" (declared: {known}).'
            )
        out.append(_condition(key, name, operator, kinds, wanted))
    return tuple(out)


def _condition(key: str, name: str, operator: str, kinds: set[str], wanted: Any) -> Condition:
    if operator == "exists":
        if not isinstance(wanted, bool):
            raise InvalidFilterError(f'attribute filter "{key}" takes True or False.')
        return Condition(name, operator, COLUMN_OF_KIND[sorted(kinds)[0]], wanted)
    if operator == "in":
        if isinstance(wanted, str) or not isinstance(wanted, list | tuple | set | frozenset) or not wanted:
            raise InvalidFilterError(f'attribute filter "{key}" takes a non-empty list of values.')
        checked = [_value(key, kinds, item, operator) for item in wanted]
        columns = {column for column, _ in checked}
        if len(columns) > 1:
            raise InvalidFilterError(f'attribute filter "{key}": the values must all have one type.')
        return Condition(name, operator, columns.pop(), [item for _, item in checked])
    column, checked_value = _value(key, kinds, wanted, operator)
    return Condition(name, operator, column, checked_value)


def _value(key: str, kinds: set[str], value: Any, operator: str) -> tuple[str, Any]:
    """The column a value compares with, and the value; it must suit one of the declared kinds."""
    if isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, int | float):
        try:
            value = float(value)  # the float8 column's type; an int beyond a float8 overflows here
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise InvalidFilterError(f'attribute filter "{key}" needs a finite number (within a float8\'s range).')
        kind = "int" if "int" in kinds else "float"
    elif isinstance(value, str):
        if not is_storable(value):
            raise InvalidFilterError(f'attribute filter "{key}": text holds no NUL and no lone surrogate.')
        kind = "str" if "str" in kinds else "keywords"
    elif isinstance(value, datetime):
        if value.utcoffset() is None:
            raise InvalidFilterError(f'attribute filter "{key}" needs an aware datetime.')
        if not _in_range(value):
            raise InvalidFilterError(f'attribute filter "{key}": {value.isoformat()} is outside years 1-9999 in UTC.')
        kind = "datetime"
    else:
        raise InvalidFilterError(
            f'attribute filter "{key}": a value of type {type(value).__name__} cannot be compared.'
        )
    if kind not in kinds:
        raise InvalidFilterError(
            f'attribute filter "{key}": the attribute is declared as {" or ".join(sorted(kinds))}, not {kind}.'
        )
    if kind == "bool" and operator in _RANGE_OPERATORS:
        raise InvalidFilterError(f'attribute filter "{key}": a bool attribute takes equality, "in" or "exists".')
    return COLUMN_OF_KIND[kind], value


def parse_where(where: list[str]) -> dict[str, Any]:
    """The ``list_workflows`` keyword arguments of ``KEY=VALUE`` texts (``weft list --where``, the
    admin's bulk form and search): KEY a filter name, or an attribute with an optional ``__op``;
    VALUE JSON when it parses as JSON, else text (an ISO 8601 time with a zone is a datetime).

    Raises:
        InvalidFilterError: a text without "=", or a VALUE nested too deep for the JSON parser.
    """
    out: dict[str, Any] = {}
    attributes: dict[str, Any] = {}
    for item in where:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise InvalidFilterError(f'A filter is KEY=VALUE, e.g. customer=acme or amount__gte=10 (got "{item}").')
        value = _where_value(text)
        if key in _FILTERS and key != "attributes":
            if key in ("status", "workflow_type") and key in out:
                previous = out[key] if isinstance(out[key], list) else [out[key]]
                value = [*previous, value]
            out[key] = value
        else:
            attributes[key] = value
    if attributes:
        out["attributes"] = attributes
    return out


def _where_value(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    except RecursionError:  # no filter value nests deeper than a list of values
        raise InvalidFilterError(f'A filter value is nested too deep to be JSON (got "{text:.60}").') from None
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if moment.utcoffset() is not None:
                return moment
        except ValueError:
            pass
    return value


def encode_cursor(created_at: datetime | None, workflow_id: str) -> str:
    """The opaque page cursor after the run (created_at, id); created_at None: the run's created_at
    cannot be read (a hand edit), the next page compares with it in SQL."""
    packed = json.dumps([None if created_at is None else created_at.isoformat(), workflow_id]).encode()
    return base64.urlsafe_b64encode(packed).decode().rstrip("=")


def decode_cursor(cursor: Any) -> tuple[datetime | None, str]:
    """The keyset position of a cursor. Raises InvalidFilterError for one this module did not make."""
    try:
        if not isinstance(cursor, str):
            raise TypeError
        packed = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, workflow_id = json.loads(packed)
        if not isinstance(workflow_id, str) or not is_storable(workflow_id):
            raise ValueError
        if created is None:  # after a run whose created_at cannot be read
            return None, workflow_id
        moment = datetime.fromisoformat(created)
        if moment.utcoffset() is None or not _in_range(moment):
            raise ValueError
        return moment, workflow_id
    except (TypeError, ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidFilterError(
            f"cursor {cursor!r:.60} is not a cursor of list_workflows: pass a page's next_cursor unchanged."
        ) from None


def list_workflows(*, limit: int = DEFAULT_LIMIT, cursor: str | None = None, **filters: Any) -> WorkflowPage:
    """A page of the workflows matching ``filters``, newest first (one query, plus one for their attributes).

    Args:
        limit: page size, 1 to 1000.
        cursor: a previous page's ``next_cursor`` (None: the first page).
        filters: ``status`` (a status or a list), ``workflow_type`` (a name, a workflow, or a list),
            ``attributes`` (``{"customer": "acme", "amount__gte": 10, "tags": "vip"}``),
            ``created_after`` / ``created_before``, ``started_after`` / ``started_before``,
            ``ended_after`` / ``ended_before`` (aware datetimes: after is inclusive, before exclusive),
            ``parent_id``, ``schedule_id``, ``id_prefix``.

    Raises:
        InvalidFilterError: a bad filter, limit or cursor (nothing was read).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidFilterError(f"limit must be a whole number from 1 to {MAX_LIMIT} (got {limit!r}).")
    chosen = selection(**filters)
    after = decode_cursor(cursor) if cursor is not None else None
    rows = visibility.page(chosen, after, limit + 1, database_alias())
    more = len(rows) > limit
    rows = rows[:limit]
    summaries = [
        WorkflowSummary(**{**row, "run_id": str(row["run_id"]), "status": _status(row["status"])}) for row in rows
    ]
    last = summaries[-1] if summaries else None
    return WorkflowPage(summaries, encode_cursor(last.created_at, last.id) if more and last else None)


def count_workflows(**filters: Any) -> int:
    """How many workflows match ``filters`` (those of ``list_workflows``).

    Raises:
        InvalidFilterError: a bad filter (nothing was read).
    """
    return visibility.count(selection(**filters), database_alias())


async def alist_workflows(**options: Any) -> WorkflowPage:
    """Async twin of :func:`list_workflows`."""
    return await sync_to_async(list_workflows)(**options)


async def acount_workflows(**filters: Any) -> int:
    """Async twin of :func:`count_workflows`."""
    return await sync_to_async(count_workflows)(**filters)


__all__ = [
    "WorkflowPage",
    "WorkflowSummary",
    "acount_workflows",
    "alist_workflows",
    "count_workflows",
    "list_workflows",
    "parse_where",
    "selection",
]
