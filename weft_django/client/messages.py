"""Signals, queries and updates sent to a run by id.

``signal()`` joins the caller's transaction. ``query()`` and ``update()`` wait for an engine, so (like
``result()``) they run on a weft-wait thread with their own autocommit connection and never join the
caller's transaction. Answers wake them through "a:<request id>" on PostgreSQL (the shared LISTEN
connection); elsewhere they poll.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.db import transaction

from .. import codec, tracing
from ..exceptions import (
    QueryTimeoutError,
    UpdateTimeoutError,
    WorkflowNotFoundError,
    WorkflowStateError,
    WorkflowTerminalError,
)
from ..queries_and_updates import query_on_thread, update_on_thread
from ..status import TERMINAL_STATUSES
from ..store import mailbox
from ..store.backend import backend
from ..validation import validate_workflow_id
from ..waits import Caller, afinish, finish, submit
from .common import _UNSET, _alias, _validate_key, _validate_name, _validate_signal_name, _wait_seconds

# ------------------------------------------------------------------------------------------ signal

SIGNAL_ATTEMPTS = 5  # inserts of one signal, when its run becomes active between an insert and the look after it


def signal(id: str, name: str, payload: Any = None, *, signal_id: str | None = None) -> None:
    """Send signal ``name`` to the current run of workflow ``id``; durable once the caller commits.

    A repeated ``signal_id`` for the same run is a no-op (the new payload is ignored). A run started
    (or retried) while the signal is sent gets it. Raises WorkflowTerminalError for a finished run,
    WorkflowNotFoundError for an unknown id, and WorkflowStateError if the run kept changing under
    the send (see ``_buffer_signal``).
    """
    validate_workflow_id(id)
    _validate_signal_name(name, "name")
    if signal_id is not None:
        _validate_key(signal_id, "signal_id")
    text = codec.encode_payload(payload, path="payload")
    using = _alias()
    attributes = {"weft.workflow_id": id, "weft.signal": name, "weft.signal_id": signal_id}
    with tracing.span("weft.signal", kind="PRODUCER", attributes=attributes):
        if backend(using).writes_in_one_statement:
            status = _buffer_signal(id, name, text, signal_id, using)  # one statement: atomic by itself
        else:
            with transaction.atomic(using=using):
                status = _buffer_signal(id, name, text, signal_id, using)
    if status is None:
        raise WorkflowNotFoundError(f'Cannot signal workflow "{id}": no such workflow. Check the id.')
    if status in TERMINAL_STATUSES:
        raise WorkflowTerminalError(
            f'Cannot signal workflow "{id}": it already ended ({status}), so nothing would receive "{name}".'
        )


def _buffer_signal(id: str, name: str, text: str, signal_id: str | None, using: str) -> str | None:
    """Append the signal to the current run's mailbox while that run is active and send the wake-up
    (``store.mailbox.buffer_signal``). Returns "buffered" (or "duplicate" for a repeated signal_id,
    already in that run's mailbox), else the run's terminal status, or None when there is no such
    workflow. A run that became active after the insert's snapshot (a start or retry committed in
    between) gets the signal: it is inserted again, never reported sent without its row.

    Raises:
        WorkflowStateError: the run changed under every attempt (or the caller's transaction keeps
            one snapshot, as REPEATABLE READ does, in which the run is not active).
    """
    for _ in range(SIGNAL_ATTEMPTS):
        if mailbox.buffer_signal(id, name, text, signal_id, using, tracing.capture()):
            return "buffered"  # (SQLite has no wake-ups: engines poll)
        status, repeated = mailbox.why_not_buffered(id, signal_id, using)
        if status is None or status in TERMINAL_STATUSES:
            return status
        if repeated:
            return "duplicate"
    raise WorkflowStateError(
        f'Cannot signal workflow "{id}": its run became active after each of {SIGNAL_ATTEMPTS} attempts to '
        f'buffer "{name}" saw it inactive. Send it again (outside a REPEATABLE READ transaction).'
    )


# ---------------------------------------------------------------------------------------- messages


def query(id: str, name: str, arg: Any = _UNSET, *, timeout: Any = "5s") -> Any:
    """Ask workflow ``id`` a question; the engine that holds it answers from its live context:
    ``activity_progress`` (built in), then the query handler (called with ``arg`` when given, with no
    argument otherwise), then the exposed accessor.

    Returns None for a finished run. Raises WorkflowNotFoundError (unknown id), QueryNotFoundError
    (no such query), QueryFailedError (the handler raised; ``.error``) and QueryTimeoutError (no
    answer within ``timeout``, saying why: no engine holds the run, it is suspended, ...)."""
    return finish(*_submit_query(id, name, arg, timeout), _query_unstarted(id, name))


def update(id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s") -> Any:
    """Send update ``name`` to workflow ``id`` and return its handler's result.

    Durable from admission. The owning engine runs the validator, then the handler, and answers.
    Raises UpdateValidationError (``.issues``; the run is unchanged), UpdateFailedError (the handler
    or validator raised; ``.error``; the run goes on), UpdateTimeoutError (not applied within
    ``timeout``: the request is marked expired and never applied), WorkflowTerminalError and
    WorkflowNotFoundError; CorruptPayloadError when the update's stored row holds a status weft never
    writes (a hand edit). A repeated ``idempotency_key`` (per run) returns the stored response and
    applies once; after a timeout it re-admits the request."""
    with _update_span(id, name):
        return finish(*_submit_update(id, name, payload, idempotency_key, timeout), _update_unstarted(id, name))


async def aquery(id: str, name: str, arg: Any = _UNSET, *, timeout: Any = "5s") -> Any:
    """Async twin of :func:`query` (the wait runs on a weft-wait thread, not the event loop)."""
    return await afinish(*_submit_query(id, name, arg, timeout), _query_unstarted(id, name))


async def aupdate(
    id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s"
) -> Any:
    """Async twin of :func:`update`."""
    with _update_span(id, name):
        return await afinish(*_submit_update(id, name, payload, idempotency_key, timeout), _update_unstarted(id, name))


def _update_span(id: str, name: str) -> Any:
    """The ``weft.update`` span (no-op without tracing), around the admission and the wait."""
    return tracing.span("weft.update", kind="PRODUCER", attributes={"weft.workflow_id": id, "weft.update": name})


def _submit_query(id: str, name: str, arg: Any, timeout: Any) -> tuple[Any, Caller]:
    validate_workflow_id(id)
    _validate_name(name, "name")
    seconds = _wait_seconds(timeout)
    arg_text = None if arg is _UNSET else codec.encode_payload(arg, path="arg")
    return submit(query_on_thread, id, name, arg is not _UNSET, arg_text, seconds, _alias(), seconds=seconds)


def _submit_update(id: str, name: str, payload: Any, idempotency_key: str | None, timeout: Any) -> tuple[Any, Caller]:
    validate_workflow_id(id)
    _validate_name(name, "name")
    if idempotency_key is not None:
        _validate_key(idempotency_key, "idempotency_key")
    seconds = _wait_seconds(timeout)
    text = codec.encode_payload(payload, path="payload")
    waiting = functools.partial(update_on_thread, trace_context=tracing.capture())  # the wait runs on another thread
    return submit(waiting, id, name, text, idempotency_key, seconds, _alias(), seconds=seconds)


def _query_unstarted(id: str, name: str) -> Callable[[str], BaseException]:
    """The error of a query that never got a weft-wait thread (``waits.finish``): nothing was asked."""
    return lambda why: QueryTimeoutError(f'Query "{name}" to workflow "{id}" was not asked: {why}. Ask again.')


def _update_unstarted(id: str, name: str) -> Callable[[str], BaseException]:
    """The error of an update that never got a weft-wait thread (``waits.finish``): nothing was written."""
    return lambda why: UpdateTimeoutError(
        f'Update "{name}" to workflow "{id}" was not sent (nothing was written, so it will never be applied): '
        f"{why}. Send it again."
    )
