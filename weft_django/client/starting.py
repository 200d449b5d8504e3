"""Starting runs: ``start`` (ids, idempotency keys, on_conflict, delayed starts), ``start_or_signal``
and ``start_with_update``. A start joins the caller's ``transaction.atomic()`` on the WEFT database
and takes effect (wake-up included) when it commits; the rows are written by ``store.runs.create_run``.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q

from .. import codec, events, tracing, transitions
from ..conf import warn_if_invalid
from ..exceptions import (
    IdempotencyKeyPurgedError,
    InvalidArgumentError,
    WorkflowAlreadyExistsError,
    WorkflowNotFoundError,
    WorkflowTerminalError,
)
from ..models import ContinuedRun, IdempotencyKey, Workflow
from ..queries_and_updates import admit, update_on_thread
from ..queueing import queue_options
from ..registry import WorkflowDefinition, resolve_workflow
from ..search_attributes import check_values
from ..status import TERMINAL_STATUSES
from ..store import runs, visibility
from ..store.moments import readable
from ..validation import validate_workflow_id
from ..waits import Wait, finish, submit
from .common import (
    ON_CONFLICT,
    _alias,
    _duration,
    _encode_input,
    _start_time,
    _validate_key,
    _validate_name,
    _validate_signal_name,
    _wait_seconds,
)
from .handles import WorkflowHandle
from .messages import _buffer_signal, _update_unstarted


class _Plan:
    """Everything a start writes, computed before the first query."""

    def __init__(
        self,
        definition: WorkflowDefinition,
        input_text: str,
        delay: timedelta | datetime | None,
        execution_timeout: timedelta | None,
        idempotency_key: str | None,
        queue: str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
    ) -> None:
        self.definition = definition
        self.input_text = input_text
        self.delay = delay
        self.execution_timeout = execution_timeout
        self.idempotency_key = idempotency_key
        self.queue = queue
        self.priority = priority
        self.concurrency_key = concurrency_key
        self.trace_context = tracing.capture()  # the caller's (inside weft.start: the start span's)
        self.attributes: dict[str, Any] = {}  # checked search attributes written with the run (issue 19)

    def run(self, workflow_id: str) -> runs.NewRun:
        """The run this plan creates under ``workflow_id``."""
        return runs.NewRun(
            workflow_id=workflow_id,
            workflow_type=self.definition.name,
            version=self.definition.version,
            input_text=self.input_text,
            delay=self.delay,
            execution_timeout=self.execution_timeout,
            idempotency_key=self.idempotency_key,
            trace_context=self.trace_context,
            queue=self.queue,
            priority=self.priority,
            concurrency_key=self.concurrency_key,
        )

    def one_statement(self, using: str) -> bool:
        """Whether its start is one statement (``store.runs.one_statement``)."""
        return runs.one_statement(self.run(""), using)


def _try_insert_run(plan: _Plan, workflow_id: str, using: str, *, savepoint: bool = True) -> bool:
    """Insert a new run with its claim (fresh epoch, no holder) and its idempotency key, if any
    (``store.runs.create_run``); False, with nothing written, when the id or key is taken.

    On PostgreSQL one statement that cannot fail on a taken id or key (no savepoint needed); elsewhere
    the ORM insert in a savepoint, so a taken id rolls back only that savepoint."""
    if plan.attributes:  # the run and its attributes in one transaction
        with transaction.atomic(using=using, savepoint=savepoint):
            created = runs.create_run(plan.run(workflow_id), using, savepoint=savepoint)
            if created is not None:
                visibility.write({workflow_id: plan.attributes}, using)
    else:
        created = runs.create_run(plan.run(workflow_id), using, savepoint=savepoint)
    if created is None:
        return False
    events.workflow_started(created, using)
    return True


def _insert_run(plan: _Plan, workflow_id: str, using: str, *, savepoint: bool = True) -> None:
    """As ``_try_insert_run``; IntegrityError when the id or the key is taken."""
    if not _try_insert_run(plan, workflow_id, using, savepoint=savepoint):
        raise IntegrityError(f"workflow id {workflow_id!r} or idempotency key {plan.idempotency_key!r} is taken")


def _replace_run(plan: _Plan, workflow_id: str, using: str, *, or_keep: bool = False) -> bool | None:
    """on_conflict="start_new": a new run over a terminal one. False when the id is free again.
    ``or_keep``: a run that is no longer terminal when locked (another call started one over it
    meanwhile) is kept and None returned; without it, that raises WorkflowAlreadyExistsError."""
    existing = transitions.lock_workflow(workflow_id, using)
    if existing is None:
        return False
    _check_type(workflow_id, existing["workflow_type"], plan.definition)
    if existing["status"] not in TERMINAL_STATUSES:
        if or_keep:
            return None
        raise WorkflowAlreadyExistsError(
            f'Workflow "{workflow_id}" is still {existing["status"]}; on_conflict="start_new" replaces '
            f"only a finished run. Cancel it first, or use another id."
        )
    transitions.delete_run_rows([workflow_id], using)
    events.workflow_started(runs.replace_run(plan.run(workflow_id), using), using)
    if plan.attributes:
        visibility.write({workflow_id: plan.attributes}, using)
    return True


def _check_type(workflow_id: str, existing_type: str, definition: WorkflowDefinition) -> None:
    if existing_type != definition.name:
        raise WorkflowAlreadyExistsError(
            f'Workflow "{workflow_id}" already exists as a "{existing_type}" run, not "{definition.name}". '
            f"Use another id."
        )


def _resolve_conflict(plan: _Plan, workflow_id: str, on_conflict: str, using: str) -> WorkflowHandle | None:
    """Apply ``on_conflict`` to an existing id; None when the id turned out to be free."""
    if on_conflict == "start_new":
        return WorkflowHandle(workflow_id) if _replace_run(plan, workflow_id, using) else None
    existing = Workflow.objects.using(using).filter(pk=workflow_id).values("workflow_type", "status").first()
    if existing is None:
        return None
    if on_conflict == "use_existing":
        _check_type(workflow_id, existing["workflow_type"], plan.definition)
        return WorkflowHandle(workflow_id)
    raise WorkflowAlreadyExistsError(
        f'Workflow "{workflow_id}" already exists ({existing["workflow_type"]}, {existing["status"]}). Pass '
        f'on_conflict="use_existing" to get its handle, on_conflict="start_new" to start a new run over a '
        f"finished one, or use another id."
    )


def _start_with_id(plan: _Plan, workflow_id: str, on_conflict: str, using: str) -> WorkflowHandle:
    for _ in range(transitions.MAX_ATTEMPTS):
        # The insert is the test for a taken id; a taken id writes nothing and leaves the caller's
        # transaction usable (_try_insert_run).
        if _try_insert_run(plan, workflow_id, using):
            return WorkflowHandle(workflow_id)
        handle = transitions.run_in_transaction(using, lambda: _resolve_conflict(plan, workflow_id, on_conflict, using))
        if handle is not None:
            return handle
    raise WorkflowAlreadyExistsError(  # pragma: no cover - the id was created and purged over and over
        f'Workflow "{workflow_id}" kept changing while it was being started; try again.'
    )


def _existing_for_key(key: str, definition: WorkflowDefinition, using: str) -> WorkflowHandle | None:
    # Only the columns used, purged_at through readable(): a key row whose timestamps a hand edit put
    # past year 9999 must not make every start with that key raise DataError.
    mapping = (
        IdempotencyKey.objects.using(using)
        .filter(pk=key)
        .annotate(purged=ExpressionWrapper(Q(purged_at__isnull=False), BooleanField()), on=readable("purged_at"))
        .values_list("workflow_id", "run_id", "purged", "on")
        .first()
    )
    if mapping is None:
        return None
    workflow_id, run_id, purged, purged_on = mapping
    current = Workflow.objects.using(using).filter(pk=workflow_id).values("run_id", "workflow_type").first()
    # The run it started may have continued as new: its chain (ContinuedRun rows, deleted when a new run
    # replaces the workflow) is still this workflow's.
    continued = ContinuedRun.objects.using(using).filter(workflow_id=workflow_id, run_id=run_id)
    moved = current is not None and current["run_id"] != run_id and not continued.exists()
    if purged or current is None or moved:
        when = f" on {purged_on:%Y-%m-%d %H:%M:%S %Z}" if purged_on else ""
        raise IdempotencyKeyPurgedError(
            f'Idempotency key "{key}" started workflow "{workflow_id}", whose run was '
            f"purged{when} or replaced. Use a new key to start another run."
        )
    _check_type(workflow_id, current["workflow_type"], definition)
    return WorkflowHandle(workflow_id)


def _start_with_key(plan: _Plan, key: str, using: str) -> WorkflowHandle:
    if plan.one_statement(using):
        # PostgreSQL: insert first (one statement; a taken key inserts nothing), then look the key up.
        for _ in range(transitions.MAX_ATTEMPTS):
            workflow_id = str(uuid.uuid4())
            if _try_insert_run(plan, workflow_id, using):
                return WorkflowHandle(workflow_id)
            existing = _existing_for_key(key, plan.definition, using)
            if existing is not None:
                return existing
    for _ in range(transitions.MAX_ATTEMPTS):
        try:
            with transaction.atomic(using=using):
                existing = _existing_for_key(key, plan.definition, using)
                if existing is not None:
                    return existing
                workflow_id = str(uuid.uuid4())
                _insert_run(plan, workflow_id, using, savepoint=False)  # a taken key rolls this atomic() back
                return WorkflowHandle(workflow_id)
        except IntegrityError:
            continue
    raise WorkflowAlreadyExistsError(  # pragma: no cover
        f'Idempotency key "{key}" could not be resolved after {transitions.MAX_ATTEMPTS} attempts; try again.'
    )


def start(
    workflow: Any,
    /,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    id: str | None = None,
    idempotency_key: str | None = None,
    on_conflict: str = "error",
    start_after: Any = None,
    start_at: datetime | None = None,
    execution_timeout: Any = None,
    attributes: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    concurrency_key: str | None = None,
) -> WorkflowHandle:
    """Start a run of ``workflow`` (the decorated function, its definition or its registered name).

    The new run is ``running`` with no owner until an engine claims it, or ``pending`` until
    ``start_after`` / ``start_at``, or, in a queue (``queue=``, else the workflow's
    ``@weft.workflow(queue=)``), ``pending`` until an engine admits it within the queue's limits
    (docs/queues.md). Joins the caller's transaction; the run exists once it commits.

    Args:
        attributes: search attributes the run starts with (declared on the workflow; written with the
            run; InvalidSearchAttributeError for an undeclared name or a value of another type).
        queue: a queue of WEFT["QUEUES"] (UnknownQueueError otherwise; nothing is written).
        priority: its priority in a queue with ``"priorities": True``: a whole number from 0 (the
            default, first) to 2**31-1; lower runs first, FIFO within a priority.
        concurrency_key: at most one run of the queue with this key is admitted and not ended at a time.

    Raises:
        InvalidArgumentError: a bad argument (also a priority or key without a queue, a delayed start in
            a queue); UnknownQueueError: no such queue. Nothing is written.
    """
    if id is not None and idempotency_key is not None:
        raise InvalidArgumentError(
            "id and idempotency_key are mutually exclusive: with an idempotency key the workflow id is "
            "generated. Pass one of them."
        )
    if on_conflict not in ON_CONFLICT:
        raise InvalidArgumentError(f'on_conflict must be "error", "use_existing" or "start_new" (got {on_conflict!r}).')
    if id is not None:
        validate_workflow_id(id)
    if idempotency_key is not None:
        _validate_key(idempotency_key, "idempotency_key")
    delay = _start_time(start_after, start_at)
    timeout = (
        _duration(execution_timeout, "execution_timeout", positive=True) if execution_timeout is not None else None
    )
    definition = resolve_workflow(workflow)
    queued = queue_options(definition, queue, priority, concurrency_key, delayed=delay is not None)
    warn_if_invalid()  # a WEFT typo is heard of here, not only when an engine refuses to start
    with _start_span(definition, id) as span:
        plan = _Plan(definition, _encode_input(args, kwargs), delay, timeout, idempotency_key, *queued)
        if attributes is not None:
            plan.attributes = check_values(definition.attributes, attributes, f'weft.start of "{definition.name}"')
        using = _alias()
        if idempotency_key is not None:
            handle = _start_with_key(plan, idempotency_key, using)
        elif id is not None:
            handle = _start_with_id(plan, id, on_conflict, using)
        else:
            handle = WorkflowHandle(str(uuid.uuid4()))
            _insert_run(plan, handle.id, using)  # one statement (in autocommit its own transaction), or atomic()
        tracing.set_attribute(span, "weft.workflow_id", handle.id)
        return handle


def _start_span(definition: WorkflowDefinition, workflow_id: str | None) -> Any:
    """The ``weft.start`` span (no-op without tracing): the new run's spans are its children."""
    attributes = {"weft.workflow_type": definition.name, "weft.workflow_version": definition.version}
    return tracing.span("weft.start", kind="PRODUCER", attributes={**attributes, "weft.workflow_id": workflow_id})


async def astart(workflow: Any, /, **options: Any) -> WorkflowHandle:
    """Async twin of :func:`start`."""
    return await sync_to_async(start)(workflow, **options)


def start_or_signal(
    workflow: Any,
    signal_name: str,
    payload: Any = None,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    id: str,
    signal_id: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> tuple[WorkflowHandle, str]:
    """Signal run ``id``, starting it first if it is absent or finished (as ``on_conflict="start_new"``),
    in one transaction. Returns ``(handle, "started" | "signalled")``. A run of another workflow type
    under ``id`` raises WorkflowAlreadyExistsError. A run started here of a workflow declared with
    ``@weft.workflow(queue=)`` waits in that queue (the signal is buffered for it). ``attributes``: the
    search attributes a run started here begins with, as for ``start`` (InvalidSearchAttributeError
    before anything is written). Joins the caller's transaction, like ``start``."""
    validate_workflow_id(id)
    _validate_signal_name(signal_name, "signal_name")
    if signal_id is not None:
        _validate_key(signal_id, "signal_id")
    text = codec.encode_payload(payload, path="payload")
    definition = resolve_workflow(workflow)
    using = _alias()
    with _start_span(definition, id):
        plan = _plan_with_message(definition, args, kwargs, attributes)

        def deliver(started: bool) -> bool:
            status = _buffer_signal(id, signal_name, text, signal_id, using)
            return status in ("buffered", "duplicate")  # else the run ended meanwhile: go round

        outcome = _with_run(plan, id, using, deliver)
    return WorkflowHandle(id), "started" if outcome else "signalled"


def start_with_update(
    workflow: Any,
    update_name: str,
    payload: Any = None,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    id: str,
    idempotency_key: str | None = None,
    timeout: Any = "5s",
    attributes: Mapping[str, Any] | None = None,
) -> tuple[WorkflowHandle, Any]:
    """Send update ``update_name`` to run ``id``, starting it first if it is absent or finished, with
    the start and the update's admission in one transaction; then wait for the update's result.
    Returns ``(handle, result)``; the errors are those of :func:`update` and WorkflowAlreadyExistsError
    for a run of another type. A run started here of a workflow declared with ``@weft.workflow(queue=)``
    waits in that queue (the update is answered once it is admitted and runs, within ``timeout``).
    ``attributes``: the search attributes a run started here begins with, as for ``start``. Waits, so
    it uses its own connection (never the caller's transaction)."""
    validate_workflow_id(id)
    _validate_name(update_name, "update_name")
    if idempotency_key is not None:
        _validate_key(idempotency_key, "idempotency_key")
    seconds = _wait_seconds(timeout)
    text = codec.encode_payload(payload, path="payload")
    definition = resolve_workflow(workflow)
    alias = _alias()
    with _start_span(definition, id):
        plan = _plan_with_message(definition, args, kwargs, attributes)
        admission = functools.partial(_admit_starting, plan, id, update_name, text, idempotency_key, alias)
        waiting = functools.partial(update_on_thread, admission=admission)
        future, caller = submit(waiting, id, update_name, text, idempotency_key, seconds, alias, seconds=seconds)
        return WorkflowHandle(id), finish(future, caller, _update_unstarted(id, update_name))


def _plan_with_message(
    definition: WorkflowDefinition, args: Sequence[Any], kwargs: Mapping[str, Any] | None, attributes: Any
) -> _Plan:
    """The start of start_or_signal / start_with_update: no delay, timeout or key; the workflow's own
    queue (``@weft.workflow(queue=)``: the run waits there, as start()'s would); checked attributes."""
    plan = _Plan(
        definition,
        _encode_input(args, kwargs),
        None,
        None,
        None,
        *queue_options(definition, None, None, None, delayed=False),
    )
    if attributes is not None:
        plan.attributes = check_values(definition.attributes, attributes, f'a start of "{definition.name}"')
    return plan


def _with_run(plan: _Plan, workflow_id: str, using: str, deliver: Any) -> bool:
    """In one transaction: start run ``workflow_id`` if it is absent or finished, then ``deliver(started)``.
    Returns whether a run was started. ``deliver`` returns False when the run ended in between."""
    for _ in range(transitions.MAX_ATTEMPTS):
        with transaction.atomic(using=using):
            started = _try_insert_run(plan, workflow_id, using)
            if not started:
                existing = (
                    Workflow.objects.using(using).filter(pk=workflow_id).values("workflow_type", "status").first()
                )
                if existing is None:
                    continue  # purged meanwhile: insert again
                _check_type(workflow_id, existing["workflow_type"], plan.definition)
                started = existing["status"] in TERMINAL_STATUSES
                if started:
                    replaced = _replace_run(plan, workflow_id, using, or_keep=True)
                    if replaced is False:
                        continue  # purged meanwhile: insert again
                    started = bool(replaced)  # None: another call started a run over it meanwhile: deliver to that
            if deliver(started):
                return started
    raise WorkflowAlreadyExistsError(  # pragma: no cover - the run kept ending and restarting
        f'Workflow "{workflow_id}" kept changing while it was being started; try again.'
    )


def _admit_starting(
    plan: _Plan, workflow_id: str, name: str, text: str, key: str | None, alias: str, wait: Wait, update_id: Any
) -> str:
    """start_with_update's admission, on its weft-wait thread: start the run if it is absent or
    finished and admit the update (a new one gets ``update_id``), in one transaction (again after a
    concurrent admission with the same key). Returns the update's id."""
    admitted: list[str] = []

    def deliver(started: bool) -> bool:
        try:
            admitted.append(admit(workflow_id, name, text, key, wait, alias, plan.trace_context, update_id))
        except (WorkflowTerminalError, WorkflowNotFoundError):
            if started:
                raise
            return False  # the run ended (or was purged) after it was read: go round, a new run is started
        return True

    for attempt in range(transitions.MAX_ATTEMPTS):
        try:
            _with_run(plan, workflow_id, alias, deliver)
            break
        except IntegrityError:
            admitted.clear()
            if attempt == transitions.MAX_ATTEMPTS - 1:
                raise
    return admitted[-1]
