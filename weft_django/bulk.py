"""Bulk operations by filter: cancel, retry and purge every workflow a ``list_workflows`` filter
selects, after a confirmation count. Each workflow goes through its own fenced transition
(``weft_django.transitions``), in batches of ids; nothing changes when the count is stale."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async

from . import transitions
from .conf import database_alias
from .exceptions import (
    BulkCountChangedError,
    InvalidFilterError,
    WeftError,
    WorkflowNotFoundError,
    WorkflowStateError,
    WorkflowTerminalError,
)
from .status import ACTIVE_STATUSES, TERMINAL_STATUSES, WorkflowStatus
from .store import visibility as store
from .validation import validate_reason
from .visibility import selection

DEFAULT_BATCH_SIZE = 100
MAX_BATCH_SIZE = 1000
# The statuses each operation applies to: the filter is narrowed to them, and so is the count.
APPLIES_TO: dict[str, tuple[str, ...]] = {
    "cancel": tuple(sorted(ACTIVE_STATUSES)),
    "retry": (WorkflowStatus.FAILED,),
    "purge": tuple(sorted(TERMINAL_STATUSES)),
}


@dataclasses.dataclass(frozen=True)
class BulkResult:
    """What a bulk operation did: ``matched`` (the confirmed count), ``changed`` (workflows it
    cancelled, retried or purged), ``skipped`` (ids that no longer qualified at their turn: they
    ended, were retried, purged or started again meanwhile, checked under their claim's lock) and
    ``errors`` (id -> message: the transition refused that run, e.g. its queue is no longer in
    WEFT["QUEUES"]; the operation went on with the others)."""

    operation: str
    matched: int
    changed: int
    skipped: list[str]
    errors: dict[str, str] = dataclasses.field(default_factory=dict)


def bulk_count(operation: str, **filters: Any) -> int:
    """How many workflows ``operation`` ("cancel", "retry", "purge") would apply to under ``filters``:
    the number to pass as ``expected_count``.

    Raises:
        InvalidFilterError: an unknown operation or a bad filter.
    """
    return store.count(store.Selection(**_narrowed(operation, filters)), database_alias())


def _narrowed(operation: str, filters: dict[str, Any]) -> dict[str, Any]:
    if operation not in APPLIES_TO:
        raise InvalidFilterError(f"operation must be one of {', '.join(APPLIES_TO)} (got {operation!r}).")
    chosen = selection(**filters)
    allowed = set(APPLIES_TO[operation])
    statuses = tuple(sorted(set(chosen.statuses) & allowed)) if chosen.statuses else tuple(sorted(allowed))
    fields = {field.name: getattr(chosen, field.name) for field in dataclasses.fields(chosen)}
    fields["statuses"] = statuses or ("-",)  # a status filter outside what the operation applies to: none
    return fields


@dataclasses.dataclass
class _Tally:
    changed: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)


_Apply = Callable[[store.Selection, list[str], _Tally], None]


def _run(
    operation: str,
    apply: _Apply,
    expected_count: Any,
    batch_size: Any,
    filters: dict[str, Any],
) -> BulkResult:
    if isinstance(expected_count, bool) or not isinstance(expected_count, int) or expected_count < 0:
        raise InvalidFilterError(
            f"expected_count must be the whole number of workflows to {operation} (got {expected_count!r}); "
            f"get it from weft.bulk_count({operation!r}, ...) or count_workflows()."
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidFilterError(f"batch_size must be a whole number from 1 to {MAX_BATCH_SIZE} (got {batch_size!r}).")
    using = database_alias()
    chosen = store.Selection(**_narrowed(operation, filters))
    actual = store.count(chosen, using)
    if actual != expected_count:
        raise BulkCountChangedError(
            f"The filter now selects {actual} workflows to {operation}, not the {expected_count} confirmed; nothing "
            f"was changed. Check the filter and confirm the new count.",
            expected_count,
            actual,
        )
    tally, after = _Tally(), None
    while True:
        ids = store.ids_batch(chosen, chosen.statuses, after, batch_size, using)
        if not ids:
            break
        apply(chosen, ids, tally)
        after = ids[-1]
    return BulkResult(operation, actual, tally.changed, tally.skipped, tally.errors)


class _NoLongerSelected(Exception):
    pass


def _each(transition: Callable[[str], Any], *, family: bool = False) -> _Apply:
    """Apply ``transition`` to each id in its own fenced transaction, after checking under the claim's
    lock that the selection still matches it (the transition joins that transaction)."""

    def apply(chosen: store.Selection, ids: list[str], result: _Tally) -> None:
        using = database_alias()
        for workflow_id in ids:

            def body(workflow_id: str = workflow_id) -> None:
                if workflow_id not in store.still_selected(chosen, chosen.statuses, [workflow_id], using):
                    raise _NoLongerSelected
                transition(workflow_id)

            try:
                transitions.run_in_transaction(using, body, lock=[workflow_id], family=family)
                result.changed += 1
            except (_NoLongerSelected, WorkflowTerminalError, WorkflowStateError, WorkflowNotFoundError):
                result.skipped.append(workflow_id)  # it changed since the batch was read
            except WeftError as error:  # refused for a reason of its own: reported, the others go on
                result.errors[workflow_id] = str(error)

    return apply


def bulk_cancel(
    *, expected_count: int, reason: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE, **filters: Any
) -> BulkResult:
    """Cancel every active workflow ``filters`` select (those of ``list_workflows``), each through
    ``transitions.cancel`` (its own fenced transaction: the owner is deposed, children closed).

    Args:
        expected_count: the confirmed number (``bulk_count("cancel", **filters)``).
        reason: the cancel reason recorded on each run.
        batch_size: ids read per batch (1-1000).

    Raises:
        BulkCountChangedError: the filter selects another number now (nothing changed).
        InvalidFilterError: a bad filter, count or batch size (nothing changed).
    """
    if reason is not None:
        validate_reason(reason)
    return _run(
        "cancel", _each(lambda wid: transitions.cancel(wid, reason), family=True), expected_count, batch_size, filters
    )


def bulk_retry(*, expected_count: int, batch_size: int = DEFAULT_BATCH_SIZE, **filters: Any) -> BulkResult:
    """Retry every failed workflow ``filters`` select, each through ``transitions.retry``. Arguments and
    errors as :func:`bulk_cancel`."""
    return _run("retry", _each(transitions.retry), expected_count, batch_size, filters)


def bulk_purge(*, expected_count: int, batch_size: int = DEFAULT_BATCH_SIZE, **filters: Any) -> BulkResult:
    """Purge every terminal workflow ``filters`` select, a batch per fenced transaction
    (``transitions.purge_terminal``: one that became active meanwhile is skipped). Arguments and errors
    as :func:`bulk_cancel`."""

    def apply(chosen: store.Selection, ids: list[str], result: _Tally) -> None:
        using = database_alias()
        selected: set[str] = set()

        def matching(locked: list[str]) -> set[str]:
            # Under the claims' lock: the runs still selected, all terminal (the selection is narrowed
            # to the terminal statuses), are the ones the transaction purges; the others in the batch
            # no longer qualified (purged, started again, out of the filter). Read again if retried.
            selected.clear()
            selected.update(store.still_selected(chosen, chosen.statuses, locked, using))
            return selected

        result.changed += transitions.purge_terminal(ids, matching=matching)
        result.skipped += sorted(set(ids) - selected)

    return _run("purge", apply, expected_count, batch_size, filters)


async def abulk_cancel(**options: Any) -> BulkResult:
    """Async twin of :func:`bulk_cancel`."""
    return await sync_to_async(bulk_cancel)(**options)


async def abulk_retry(**options: Any) -> BulkResult:
    """Async twin of :func:`bulk_retry`."""
    return await sync_to_async(bulk_retry)(**options)


async def abulk_purge(**options: Any) -> BulkResult:
    """Async twin of :func:`bulk_purge`."""
    return await sync_to_async(bulk_purge)(**options)


__all__ = [
    "BulkResult",
    "abulk_cancel",
    "abulk_purge",
    "abulk_retry",
    "bulk_cancel",
    "bulk_count",
    "bulk_purge",
    "bulk_retry",
]
