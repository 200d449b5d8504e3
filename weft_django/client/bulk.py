"""Starting many runs in one call: ``StartRequest``, ``start_many`` and ``astart_many``.

One call is one transaction (it joins the caller's ``transaction.atomic()`` on the WEFT database, like
``start``): on PostgreSQL one statement per ``store.runs_bulk.CHUNK_ROWS`` requests writes every run,
its claim, key, timer and the wake-up, so 10,000 starts cost a handful of round trips and one durable
commit. What is checked before anything is written, and what is a per-request result, is in the
docstring of :func:`start_many` and in docs/howto.md ("Start many runs at once").
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import transaction

from .. import events, tracing, transitions
from ..conf import warn_if_invalid
from ..exceptions import (
    IdempotencyKeyPurgedError,
    InvalidArgumentError,
    WeftError,
    WorkflowAlreadyExistsError,
)
from ..queueing import queue_options
from ..registry import WorkflowDefinition, resolve_workflow
from ..search_attributes import check_values
from ..store import claims as store_claims
from ..store import runs_bulk, visibility
from ..validation import validate_workflow_id
from .common import ON_CONFLICT, _alias, _duration, _encode_input, _start_time, _validate_key
from .handles import WorkflowHandle
from .starting import _existing_for_key, _Plan, _resolve_conflict

# The most requests one call takes. One call is one transaction: its locks are held and its rows
# invisible to engines until it commits, so a bigger batch only delays every run in it. Split
# larger inputs into several calls (each all-or-nothing on its own).
MAX_START_MANY = 100_000


@dataclasses.dataclass(frozen=True)
class StartRequest:
    """One start of :func:`start_many`; the fields are :func:`start`'s arguments, with the same meaning.

    Attributes:
        workflow: the decorated function, its definition or its registered name.
        args, kwargs: the run's input.
        id: the workflow id (default: a new UUID); mutually exclusive with ``idempotency_key``.
        idempotency_key: a key: a second start with it returns the first one's handle.
        on_conflict: with ``id``: "error" (default), "use_existing" or "start_new".
        start_after, start_at: start later (a delay, or a moment); mutually exclusive.
        execution_timeout: the run's execution deadline, from when it begins.
        attributes: search attributes the run starts with (declared on the workflow), written in the
            same transaction as the run.
        queue, priority, concurrency_key: the queue the run waits in (default: the workflow's
            ``@weft.workflow(queue=)``), its priority there and its concurrency key (docs/queues.md).
    """

    workflow: Any
    _: dataclasses.KW_ONLY
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] | None = None
    id: str | None = None
    idempotency_key: str | None = None
    on_conflict: str = "error"
    start_after: Any = None
    start_at: datetime | None = None
    execution_timeout: Any = None
    attributes: Mapping[str, Any] | None = None
    queue: str | None = None
    priority: int | None = None
    concurrency_key: str | None = None


StartResult = WorkflowHandle | WorkflowAlreadyExistsError | IdempotencyKeyPurgedError


_E = TypeVar("_E", bound=WeftError)


def _at(index: int, error: _E) -> _E:
    """``error`` (same type, same attributes) with a message naming ``requests[index]``; ``.index`` set."""
    named = copy.copy(error)
    named.args = (f"requests[{index}]: {error}", *error.args[1:])
    named.index = index  # type: ignore[attr-defined]
    return named


class _Item:
    __slots__ = ("handle_id", "index", "key", "on_conflict", "plan", "wanted_id")

    def __init__(self, index: int, plan: _Plan, wanted_id: str | None, key: str | None, on_conflict: str) -> None:
        self.index = index
        self.plan = plan
        self.wanted_id = wanted_id  # the caller's id, or None: a new UUID (again on each attempt)
        self.key = key
        self.on_conflict = on_conflict
        self.handle_id = wanted_id if wanted_id is not None else str(uuid.uuid4())


def _prepare(index: int, request: Any, definitions: dict[Any, WorkflowDefinition]) -> _Item:
    if not isinstance(request, StartRequest):
        raise InvalidArgumentError(
            f"each request must be a weft.StartRequest (got {type(request).__name__}: {request!r:.60}); "
            f"write weft.StartRequest(workflow, args=[...], id=...)."
        )
    if request.id is not None and request.idempotency_key is not None:
        raise InvalidArgumentError(
            "id and idempotency_key are mutually exclusive: with an idempotency key the workflow id is "
            "generated. Pass one of them."
        )
    if request.on_conflict not in ON_CONFLICT:
        raise InvalidArgumentError(
            f'on_conflict must be "error", "use_existing" or "start_new" (got {request.on_conflict!r}).'
        )
    if request.id is not None:
        validate_workflow_id(request.id)
    if request.idempotency_key is not None:
        _validate_key(request.idempotency_key, "idempotency_key")
    delay = _start_time(request.start_after, request.start_at)
    timeout = request.execution_timeout
    if timeout is not None:
        timeout = _duration(timeout, "execution_timeout", positive=True)
    try:
        definition = definitions[request.workflow]
    except (KeyError, TypeError):  # TypeError: an unhashable workflow argument (resolve says what is wrong)
        definition = resolve_workflow(request.workflow)
        with contextlib.suppress(TypeError):
            definitions[request.workflow] = definition
    queued = queue_options(
        definition, request.queue, request.priority, request.concurrency_key, delayed=delay is not None
    )
    plan = _Plan(
        definition, _encode_input(request.args, request.kwargs), delay, timeout, request.idempotency_key, *queued
    )
    if request.attributes is not None:
        plan.attributes = check_values(definition.attributes, request.attributes, f'start of "{definition.name}"')
    return _Item(index, plan, request.id, request.idempotency_key, request.on_conflict)


def _check_all(requests: Any) -> list[_Item]:
    """Every request checked and encoded, nothing written; the first bad one raises (its index named)."""
    if isinstance(requests, str | bytes | Mapping | StartRequest) or not isinstance(requests, Iterable):
        raise InvalidArgumentError(
            f"requests must be a list of weft.StartRequest (got {type(requests).__name__}: {requests!r:.60})."
        )
    requests = list(requests)
    if len(requests) > MAX_START_MANY:
        raise InvalidArgumentError(
            f"start_many takes at most {MAX_START_MANY:,} requests per call (got {len(requests):,}); split them "
            f"into several calls (each call is one transaction, all-or-nothing on its own)."
        )
    definitions: dict[Any, WorkflowDefinition] = {}
    items: list[_Item] = []
    seen_ids: dict[str, int] = {}
    seen_keys: dict[str, int] = {}
    for index, request in enumerate(requests):
        try:
            item = _prepare(index, request, definitions)
        except WeftError as error:
            raise _at(index, error) from error
        for value, seen, what in ((item.wanted_id, seen_ids, "id"), (item.key, seen_keys, "idempotency_key")):
            if value is None:
                continue
            if value in seen:
                duplicate = InvalidArgumentError(
                    f"{what} {value!r} is also the {what} of requests[{seen[value]}]; one call starts each "
                    f"{what} at most once. Remove the duplicate."
                )
                raise _at(index, duplicate)
            seen[value] = index
        items.append(item)
    return items


def _resolve(item: _Item, using: str) -> WorkflowHandle | None:
    """A request whose insert was refused: apply its key or on_conflict (as ``start`` does). None: the
    id or key turned out to be free (start it again)."""
    if item.key is not None:
        return _existing_for_key(item.key, item.plan.definition, using)
    workflow_id = item.wanted_id
    assert workflow_id is not None
    return transitions.run_in_transaction(
        using, lambda: _resolve_conflict(item.plan, workflow_id, item.on_conflict, using)
    )


def _replaces(item: _Item) -> bool:
    """Whether a refused insert of ``item`` may replace the run with its id (on_conflict="start_new")."""
    return item.key is None and item.on_conflict == "start_new"


def _write(items: list[_Item], using: str) -> list[StartResult]:
    results: list[StartResult | None] = [None] * len(items)
    # Sorted by key, then id: concurrent calls insert overlapping keys and ids in the same order
    # (no deadlock between two calls that share some).
    todo = sorted(items, key=lambda item: (item.key is None, item.key or item.handle_id))
    # The runs start_new may replace: their claims locked sorted, in ONE statement, before any write of
    # this call (the lock order every transition keeps). Locked after the inserts, a call that keeps it
    # (a fork: the source's claim, then its new id) and shares an id with this one deadlocked with it.
    locked = store_claims.lock_ids([item.handle_id for item in todo if _replaces(item)], using)
    for _ in range(transitions.MAX_ATTEMPTS):
        inserted = runs_bulk.create_runs([item.plan.run(item.handle_id) for item in todo], using)
        attributes = {item.handle_id: item.plan.attributes for item in todo if item.plan.attributes}
        if attributes := {wid: values for wid, values in attributes.items() if wid in inserted}:
            visibility.write(attributes, using)  # with the runs, in the same transaction
        # A run another call created since, under an id that was free then: its claim is locked now.
        locked |= store_claims.lock_ids(
            [
                item.handle_id
                for item in todo
                if item.handle_id not in inserted and item.handle_id not in locked and _replaces(item)
            ],
            using,
        )
        retry: list[_Item] = []
        for item in todo:
            if item.handle_id in inserted:
                results[item.index] = WorkflowHandle(item.handle_id)
                events.workflow_started(item.handle_id, using)
                continue
            try:
                handle = _resolve(item, using)
            except (WorkflowAlreadyExistsError, IdempotencyKeyPurgedError) as error:
                results[item.index] = _at(item.index, error)
                continue
            if handle is not None:
                results[item.index] = handle
            else:
                if item.wanted_id is None:
                    item.handle_id = str(uuid.uuid4())
                retry.append(item)
        todo = retry
        if not todo:
            break
    if todo:  # pragma: no cover - ids created and purged over and over while the call ran
        raise WorkflowAlreadyExistsError(
            f"requests[{todo[0].index}]: its workflow kept changing while it was being started; try again."
        )
    return [result for result in results if result is not None]


def start_many(requests: Iterable[StartRequest]) -> list[StartResult]:
    """Start many runs in one transaction (one statement per 2,000 requests on PostgreSQL).

    Joins the caller's ``transaction.atomic()`` on the WEFT database: the runs exist, and engines are
    woken, when it commits, and vanish with it if it rolls back. Outside one, the call is its own
    transaction.

    Args:
        requests: ``weft.StartRequest`` objects, at most ``MAX_START_MANY`` (100,000). An empty list
            returns ``[]`` without touching the database.

    Returns:
        One result per request, in order: its ``WorkflowHandle``, or the error that request met with a
        run already in the database: ``WorkflowAlreadyExistsError`` (its id is taken and on_conflict
        is "error", or it names a run of another workflow type, or "start_new" found it still
        running) or ``IdempotencyKeyPurgedError`` (its key's run was purged). Such an error is a
        result, not raised: every other request of the call is still started. Its message names
        ``requests[i]`` and ``.index`` is ``i``.

    Raises:
        InvalidArgumentError, InvalidWorkflowIdError, WorkflowNotRegisteredError,
        PayloadNotSerializableError, PayloadSizeExceededError: a request is invalid (the first such
        one; the message names ``requests[i]``, ``.index`` is ``i``), two requests share an id or an
        idempotency key, ``requests`` is not a list of StartRequest, or it has more than
        ``MAX_START_MANY`` of them. Checked before the first query: nothing is written.
        django.db.DatabaseError: the database failed; the call's transaction (the caller's, when
        joined) must be rolled back, nothing of it is committed.
    """
    items = _check_all(requests)
    if not items:
        return []
    warn_if_invalid()
    using = _alias()
    with tracing.span("weft.start_many", kind="PRODUCER", attributes={"weft.count": len(items)}):
        # The span is current now: each run's trace context is the start_many span's.
        trace_context = tracing.capture()
        for item in items:
            item.plan.trace_context = trace_context

        def attempt() -> list[StartResult]:
            with transaction.atomic(using=using, savepoint=False):
                return _write(items, using)

        return transitions.retried(using, attempt)  # a deadlock: again, when the call owns its transaction


async def astart_many(requests: Iterable[StartRequest]) -> list[StartResult]:
    """Async twin of :func:`start_many`."""
    return await sync_to_async(start_many)(requests)
