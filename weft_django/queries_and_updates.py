"""The waiting halves of ``query()`` and ``update()`` (and ``start_with_update()``), run on a weft-wait
thread (see ``waits``): route a query to the engine that holds the run and wait for its answer; admit
an update durably (idempotency keys per run) and wait until the owning engine settles it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import Exists, OuterRef, Subquery

from . import codec, transitions
from .exceptions import (
    CorruptPayloadError,
    InvalidArgumentError,
    QueryFailedError,
    QueryNotFoundError,
    QueryTimeoutError,
    UpdateFailedError,
    UpdateTimeoutError,
    UpdateValidationError,
    WorkflowNotFoundError,
    WorkflowTerminalError,
)
from .models import PendingUpdate, QueryRequest, Workflow, WorkflowClaim
from .status import ACTIVE_STATUSES, TERMINAL_STATUSES, QueryStatus, UpdateStatus, WorkflowStatus
from .store import mailbox, sessions
from .store.backend import backend
from .store.clock import db_now
from .validation import validate_key, validate_name
from .waits import Wait

T = TypeVar("T")

REROUTE_CHECK = 1.0  # a pending query re-reads its workflow's holder this often (the engine may have died)


_UNHELD: dict[str, str] = {
    WorkflowStatus.RUNNING: "no engine holds it (it is running but unclaimed: is an engine running? start one with "
    "`manage.py weft_engine`)",
    WorkflowStatus.SUSPENDED: "it is suspended, so no engine holds it (resume it first)",
    WorkflowStatus.PENDING: "it has not started yet (a delayed start), so no engine holds it",
}


def query_on_thread(
    workflow_id: str,
    name: str,
    has_arg: bool,
    arg_text: str | None,
    seconds: float,
    alias: str,
    abandoned: threading.Event,
) -> Any:
    with Wait(alias, seconds, abandoned) as wait, _lock_wait_ends(wait, _query_locked(workflow_id, name, wait)):
        # A query only reads the run: asked again on a new connection, its worst is a second answer
        # nobody reads (the first request expires at its deadline).
        return once_more_if_lost(wait, lambda: _query(workflow_id, name, has_arg, arg_text, wait))


# SQLSTATEs of a session the server ended or a connection that failed: class 08, and 57P01-57P03
# (admin_shutdown: pg_terminate_backend; crash_shutdown; cannot_connect_now). Not 55P03 or 57014.
_CONNECTION_ENDED = ("08", "57P01", "57P02", "57P03")


def lost(exc: BaseException, alias: str) -> bool:
    """Whether ``exc`` says this thread's PostgreSQL session is gone (the backend terminated, the
    server restarted, the network cut), not that a statement failed. Judged by the error, not by the
    connection: Django may already have opened a new one under it (an ``atomic()`` block whose
    rollback failed closes the connection, and its exit opens another to restore autocommit)."""
    if not backend(alias).bounds_sessions or not isinstance(exc, OperationalError | InterfaceError):
        return False
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return sqlstate is None or str(sqlstate).startswith(_CONNECTION_ENDED)


def once_more_if_lost(wait: Wait, call: Callable[[], T]) -> T:
    """``call()``; if the wait's connection is lost under it, ``call()`` once more on a new
    connection (``Wait.reconnect``: once per wait). Only for calls that are safe to repeat."""
    try:
        return call()
    except DatabaseError as exc:
        if not lost(exc, wait.alias) or not wait.reconnect():
            raise
    return call()


def _query(workflow_id: str, name: str, has_arg: bool, arg_text: str | None, wait: Wait) -> Any:
    alias = wait.alias
    wait.subscribe(workflow_id)  # "r:<id>": the run ended
    request: str | None = None
    holder: str | None = None
    why = ""
    final = False
    recheck_at = time.monotonic() + REROUTE_CHECK
    claims = WorkflowClaim.objects.using(alias).filter(pk=OuterRef("pk")).values("engine_id")[:1]
    while True:
        if request is None:
            row = (
                Workflow.objects.using(alias)
                .filter(pk=workflow_id)
                .annotate(holder=Subquery(claims))
                .values("status", "holder", "queue")
                .first()
            )
            if row is None:
                raise WorkflowNotFoundError(
                    f'Cannot query workflow "{workflow_id}": no such workflow (never started, purged, or started '
                    f"in a transaction that has not committed yet: query() reads committed data on its own "
                    f"connection)."
                )
            if row["status"] in TERMINAL_STATUSES:
                return None
            if row["status"] == WorkflowStatus.RUNNING and row["holder"] and not wait.over:
                if row["holder"] == holder and why:
                    wait.pause(0.05)  # the same engine just turned us away: give the claim a moment
                holder, request = row["holder"], str(uuid.uuid4())
                wait.subscribe(f"a:{request}")
                now = db_now(alias)
                mailbox.ask_query(
                    request, workflow_id, holder, name, arg_text, has_arg, now, wait.db_deadline(now), alias
                )
                why = f'engine "{holder}" holds it but did not answer in time (is it overloaded or stopped?)'
            elif row["status"] == WorkflowStatus.PENDING and row["queue"] is not None:
                why = f'it is waiting in queue "{row["queue"]}" for its admission, so no engine holds it yet'
            elif row["status"] != WorkflowStatus.RUNNING or not row["holder"]:
                why = _UNHELD.get(row["status"], f"it is {row['status']}")
        else:
            answer = QueryRequest.objects.using(alias).filter(pk=request).values("status", "result", "error").first()
            status = answer["status"] if answer is not None else QueryStatus.EXPIRED
            if status == QueryStatus.ANSWERED:
                assert answer is not None
                return codec.decode(answer["result"])
            if status == QueryStatus.FAILED:
                assert answer is not None
                _raise_query_failure(workflow_id, name, answer["error"] or {})
                why = f'engine "{holder}" no longer holds it'
                request = None  # not owned there (any more): route it again
                continue
            if status == QueryStatus.EXPIRED:
                request = None
            elif time.monotonic() >= recheck_at and not wait.over:
                # The engine we asked may have died and another taken the workflow over: follow it.
                recheck_at = time.monotonic() + REROUTE_CHECK
                now_held = WorkflowClaim.objects.using(alias).filter(pk=workflow_id).values_list("engine_id")
                current = now_held.first()
                if (current[0] if current else None) != holder and (
                    QueryRequest.objects.using(alias)
                    .filter(pk=request, status=QueryStatus.PENDING)
                    .update(status=QueryStatus.EXPIRED)
                ):
                    why = f'engine "{holder}" lost the workflow before it answered'
                    request = None
                    continue
        if wait.over:
            if request is not None and not final:
                final = True  # expire our request, unless the engine answered it meanwhile
                expired = (
                    QueryRequest.objects.using(alias)
                    .filter(pk=request, status=QueryStatus.PENDING)
                    .update(status=QueryStatus.EXPIRED)
                )
                if not expired:
                    continue
            raise QueryTimeoutError(
                f'Query "{name}" to workflow "{workflow_id}" got no answer within {wait.timeout_text()}: {why}.'
            )
        wait.pause()


@contextlib.contextmanager
def _lock_wait_ends(wait: Wait, error: Callable[[], Exception]) -> Iterator[None]:
    """A statement of the wait gave up on a row lock (``Wait``: ``lock_timeout``): raise ``error()``."""
    try:
        yield
    except DatabaseError as exc:
        if not sessions.lock_wait_ended(exc):
            raise
        raise error() from exc


_LOCKED = (
    "a row it writes stayed locked by another transaction that did not end in time (one of yours, open around "
    "this call? {call}() works on its own connection, so it waits for your transaction like any other's: call "
    "it after yours commits)"
)


def _query_locked(workflow_id: str, name: str, wait: Wait) -> Callable[[], Exception]:
    return lambda: QueryTimeoutError(
        f'Query "{name}" to workflow "{workflow_id}" got no answer within {wait.timeout_text()}: '
        f"{_LOCKED.format(call='query')}."
    )


def _update_locked(workflow_id: str, name: str, wait: Wait) -> Callable[[], Exception]:
    return lambda: UpdateTimeoutError(
        f'Update "{name}" to workflow "{workflow_id}" got no answer within {wait.timeout_text()}: '
        f"{_LOCKED.format(call='update')}. It may or may not have been admitted: call update() again with the same "
        f"idempotency_key to learn its outcome."
    )


def _raise_query_failure(workflow_id: str, name: str, error: dict[str, Any]) -> None:
    reason = error.get("reason")
    if reason == "not_found":
        raise QueryNotFoundError(str(error.get("message", f'Workflow "{workflow_id}" has no query "{name}".')))
    if reason == "handler":
        raise QueryFailedError(
            f'Query "{name}" of workflow "{workflow_id}" failed: '
            f"{error.get('type', 'Error')}: {error.get('message', '')}",
            error,
        )


_SETTLED = (UpdateStatus.COMPLETED, UpdateStatus.REJECTED, UpdateStatus.FAILED, UpdateStatus.EXPIRED)
_OPEN = (UpdateStatus.ADMITTED, UpdateStatus.ACCEPTED)  # an engine settles it (or a wait_for_update took it)


def admit(
    workflow_id: str,
    name: str,
    text: str,
    key: str | None,
    wait: Wait,
    using: str,
    trace_context: str | None = None,
    update_id: Any = None,
) -> str:
    """Inside a transaction: admit the update (or find the one with this idempotency key) and send the
    wake-up. Returns the update's id (``update_id`` for a new one, when given). An expired request
    with the same key is admitted again.
    InvalidArgumentError for a bad name or key (the client checks them first; checked again here, the
    last step before they are written). ``trace_context``: the sender's (``weft_django.tracing``)."""
    validate_name(name, "name")
    if key is not None:
        validate_key(key, "idempotency_key")
    # The run and the request with this key on it in ONE statement (one snapshot), as signal() does: read
    # apart, a continue-as-new committing in between carried the request to the next run, and the key
    # was looked for on the old run, found missing there, and admitted a second time.
    found = Workflow.objects.using(using).filter(pk=workflow_id)
    if key is not None:
        same = PendingUpdate.objects.using(using).filter(run_id=OuterRef("run_id"), idempotency_key=key)
        found = found.annotate(
            key_id=Subquery(same.values("id")[:1]),
            key_name=Subquery(same.values("name")[:1]),
            key_status=Subquery(same.values("status")[:1]),
        )
    row = found.values("run_id", "status", *(("key_id", "key_name", "key_status") if key is not None else ())).first()
    if row is None:
        raise WorkflowNotFoundError(
            f'Cannot update workflow "{workflow_id}": no such workflow (never started, purged, or started in a '
            f"transaction that has not committed yet: update() works on its own connection)."
        )
    terminal = WorkflowTerminalError(
        f'Cannot update workflow "{workflow_id}": it already ended ({row["status"]}), so nothing would handle "{name}".'
    )
    now = db_now(using)
    if key is not None and row["key_id"] is not None:
        if row["key_name"] != name:
            raise InvalidArgumentError(
                f'idempotency_key "{key}" was already used for update "{row["key_name"]}" of this run; use '
                f'another key for "{name}".'
            )
        if row["key_status"] != UpdateStatus.EXPIRED:
            return str(row["key_id"])  # the same request: its stored (or coming) response
        if row["status"] in TERMINAL_STATUSES:
            raise terminal
        mailbox.readmit_update(workflow_id, row["key_id"], text, now, wait.db_deadline(now), using, trace_context)
        return str(row["key_id"])
    if row["status"] in TERMINAL_STATUSES:
        raise terminal
    deadline = wait.db_deadline(now)
    return mailbox.admit_update(
        workflow_id, row["run_id"], name, text, key, now, deadline, using, trace_context, update_id
    )


def admit_with_retry(
    workflow_id: str,
    name: str,
    text: str,
    key: str | None,
    wait: Wait,
    alias: str,
    trace_context: str | None = None,
    update_id: Any = None,
) -> str:
    for _ in range(transitions.MAX_ATTEMPTS):
        try:
            with transaction.atomic(using=alias):
                return admit(workflow_id, name, text, key, wait, alias, trace_context, update_id)
        except IntegrityError:
            continue  # a concurrent call with the same key admitted it first: find that one
    raise UpdateFailedError(f'Update "{name}" to workflow "{workflow_id}" could not be admitted; try again.')


def update_on_thread(
    workflow_id: str,
    name: str,
    text: str,
    key: str | None,
    seconds: float,
    alias: str,
    abandoned: threading.Event,
    *,
    admission: Callable[[Wait, uuid.UUID], str] | None = None,
    trace_context: str | None = None,
) -> Any:
    """The one update wait (``update()`` and ``start_with_update()``), on a weft-wait thread: admit the
    update, then wait until its run's engine settles it; returns the handler's result.

    Args:
        workflow_id, name, text, key: the update (``text``: the encoded payload; ``key``: its
            idempotency key, or None).
        seconds: how long to wait for the answer.
        alias: the connection alias.
        abandoned: set when the caller stops waiting.
        admission: admits the update in its own way and returns its id (``start_with_update``: with
            the start, in one transaction; a new update gets the id it is passed); default
            ``admit_with_retry``.
        trace_context: the sender's trace context, stored with the update (``weft_django.tracing``).

    Raises:
        The errors of ``update()``: UpdateValidationError, UpdateFailedError, UpdateTimeoutError,
        WorkflowTerminalError, WorkflowNotFoundError.
    """
    with Wait(alias, seconds, abandoned) as wait, _lock_wait_ends(wait, _update_locked(workflow_id, name, wait)):
        wait.subscribe(workflow_id)
        if admission is None:
            admission = functools.partial(
                admit_with_retry, workflow_id, name, text, key, alias=alias, trace_context=trace_context
            )
        update_id = _admit_once(wait, admission)
        # Waiting for a known update only reads it (and expires it at the deadline unless it was
        # settled): safe to do again on a new connection.
        return once_more_if_lost(wait, lambda: await_update(workflow_id, name, update_id, wait))


def _admit_once(wait: Wait, admission: Callable[..., str]) -> str:
    """Admit the update with an id chosen here, so that a connection lost under the admission (cut
    before, during or after its COMMIT) is settled on a new connection without guessing: the update
    is there (its transaction committed: wait for it) or it is not (nothing committed: admit it
    again; an idempotency key's own path writes nothing twice either). Never admitted twice."""
    chosen = uuid.uuid4()
    try:
        return admission(wait, update_id=chosen)
    except DatabaseError as exc:
        if not lost(exc, wait.alias) or not wait.reconnect():
            raise
    if PendingUpdate.objects.using(wait.alias).filter(pk=chosen).exists():
        return str(chosen)
    return admission(wait, update_id=chosen)


def _close_unanswered(update_id: str, run_id: Any, alias: str) -> int:
    """Fail an update its run can no longer answer, deciding and writing in the same statements: only
    while it is still on ``run_id`` (the sweep may have carried it to the next run meanwhile) and that
    run is not active, and, if admitted, not to be carried (``mailbox.to_be_carried``; a taken update
    is never carried); ``accepted`` marks one the workflow had taken (issue 20), by the status it has
    when written. Returns how many rows it failed (0 or 1)."""
    active = Workflow.objects.using(alias).filter(
        pk=OuterRef("workflow_id"), run_id=OuterRef("run_id"), status__in=list(ACTIVE_STATUSES)
    )
    unanswerable = PendingUpdate.objects.using(alias).filter(pk=update_id, run_id=run_id).exclude(Exists(active))
    admitted = unanswerable.filter(status=UpdateStatus.ADMITTED).exclude(
        mailbox.to_be_carried(PendingUpdate, "idempotency_key", alias)
    )
    now = db_now(alias)
    closed = 0
    for rows, taken in ((admitted, {}), (unanswerable.filter(status=UpdateStatus.ACCEPTED), {"accepted": True})):
        closed += rows.update(
            status=UpdateStatus.FAILED,
            completed_at=now,
            error={
                "type": "WorkflowTerminalError",
                "message": "The workflow ended before the update was answered.",
                **taken,
            },
        )
    return closed


def await_update(workflow_id: str, name: str, update_id: str, wait: Wait) -> Any:
    alias = wait.alias
    wait.subscribe(f"a:{update_id}")
    run_status = Subquery(
        Workflow.objects.using(alias).filter(pk=OuterRef("workflow_id"), run_id=OuterRef("run_id")).values("status")[:1]
    )
    # An update admitted to a run as it continued as new is carried to the next run by the mailbox sweep
    # while the workflow is active (mailbox.to_be_carried): its caller waits for that.
    carried = PendingUpdate.objects.using(alias).filter(
        mailbox.to_be_carried(PendingUpdate, "idempotency_key", alias), pk=update_id, status=UpdateStatus.ADMITTED
    )
    final = False
    while True:
        row = (
            PendingUpdate.objects.using(alias)
            .filter(pk=update_id)
            .annotate(run_status=run_status)
            .values("status", "result", "error", "issues", "run_status", "run_id")
            .first()
        )
        if row is None:
            raise WorkflowTerminalError(
                f'Update "{name}" to workflow "{workflow_id}": its run was replaced or purged before it answered.'
            )
        if row["status"] in _SETTLED:
            return _update_outcome(workflow_id, name, row)
        if row["status"] not in _OPEN:  # a hand edit: nothing would ever settle it
            raise CorruptPayloadError(
                f'Update "{name}" to workflow "{workflow_id}": its row (id {update_id}) holds status '
                f"{row['status']!r}, which is no status weft writes, so no engine will settle it. Repair the row's "
                "status, or send the update with another idempotency_key."
            )
        ended = row["run_status"] is None and not carried.exists()
        # The run ended without answering (a transition, or an admission that raced the end): nothing
        # can apply it any more (no engine holds a finished run), so close it. If it changed meanwhile
        # (carried to the next run), it is not closed: wait and look again.
        if (ended or row["run_status"] in TERMINAL_STATUSES) and _close_unanswered(update_id, row["run_id"], alias):
            continue
        if wait.over:
            if not final:
                final = True
                if row["status"] == UpdateStatus.ADMITTED and PendingUpdate.objects.using(alias).filter(
                    pk=update_id, status=UpdateStatus.ADMITTED
                ).update(status=UpdateStatus.EXPIRED, completed_at=db_now(alias)):
                    raise UpdateTimeoutError(
                        f'Update "{name}" to workflow "{workflow_id}" was not applied within {wait.timeout_text()}, '
                        f"so it expired and will never be applied ({_why_unapplied(row['run_status'], name)}). "
                        f"Retry with the same idempotency_key to send it again."
                    )
                continue  # the owner settled it meanwhile (or a wait_for_update took it): read it again
            raise UpdateTimeoutError(
                f'Update "{name}" to workflow "{workflow_id}" was taken by its wait_for_update("{name}") but not '
                f"answered within {wait.timeout_text()}; its respond() will still complete it (call update() again "
                f"with the same idempotency_key to wait for that)."
            )
        wait.pause()


def _why_unapplied(run_status: str | None, name: str) -> str:
    """Why an admitted update may have waited in vain, from its run's status: a suspended run has no
    engine to apply it (as ``query`` says, ``_UNHELD``)."""
    if run_status == WorkflowStatus.SUSPENDED:
        return _UNHELD[run_status]
    return f'is an engine running and does the workflow handle "{name}"?'


def _stored_issues(issues: Any) -> list[dict[str, Any]]:
    """A rejected update's stored issues as UpdateValidationError takes them: ``{"message", "path"}``
    dicts. A value of another shape (a hand edit) is one issue saying so, not an AttributeError."""
    if issues is None:
        return []
    if not isinstance(issues, list):
        return [{"message": f"the stored issues cannot be read: {issues!r:.80} is not a JSON array", "path": []}]
    return [issue if isinstance(issue, dict) else {"message": str(issue), "path": []} for issue in issues]


def _update_outcome(workflow_id: str, name: str, row: Mapping[str, Any]) -> Any:
    status = row["status"]
    if status == UpdateStatus.COMPLETED:
        return codec.decode(row["result"])
    if status == UpdateStatus.REJECTED:
        raise UpdateValidationError(name, _stored_issues(row["issues"]))
    if status == UpdateStatus.EXPIRED:
        raise UpdateTimeoutError(
            f'Update "{name}" to workflow "{workflow_id}" expired before it was applied (its caller stopped '
            f"waiting); it was not applied. Send it again to retry."
        )
    error = row["error"] if isinstance(row["error"], dict) else {}
    if error.get("type") == "WorkflowTerminalError" and error.get("accepted"):  # issue 20: consumed, not unapplied
        raise WorkflowTerminalError(
            f'Update "{name}" to workflow "{workflow_id}" was taken by the workflow\'s wait_for_update("{name}"), '
            f"but the run ended before it answered it (respond() was never called), so there is no response."
        )
    if error.get("type") == "WorkflowTerminalError" and "stage" not in error:
        raise WorkflowTerminalError(
            f'Update "{name}" to workflow "{workflow_id}" was not applied: {error.get("message", "the run ended")}'
        )
    raise UpdateFailedError(
        f'Update "{name}" to workflow "{workflow_id}" failed: {error.get("type", "Error")}: {error.get("message", "")}',
        error,
    )
