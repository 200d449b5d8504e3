"""Handles: ``WorkflowHandle`` (describe, status, result, the transitions, messages) and ``get_handle``.

``result()`` waits for an engine, so it never joins the caller's transaction: it runs on a
"weft-wait" thread with its own autocommit connection (see ``weft_django.waits``).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import OuterRef, Subquery

from .. import codec, transitions
from ..exceptions import (
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowNotFoundError,
    WorkflowTimedOutError,
)
from ..models import Step, Workflow, WorkflowClaim
from ..status import WorkflowStatus
from ..store import runs
from ..store.moments import readable_values
from ..validation import validate_reason, validate_workflow_id
from ..waits import Caller, ResultTimeoutError, afinish, finish, submit, wait_for_end
from .common import _UNSET, SUMMARY_FIELDS, _alias, _duration, _status
from .messages import aquery, aupdate, query, signal, update

# ------------------------------------------------------------------------------------------ result


def _outcome(workflow_id: str, row: dict[str, Any]) -> Any:
    status = row["status"]
    if status == WorkflowStatus.COMPLETED:
        return codec.decode(row["result"])
    if status == WorkflowStatus.FAILED:
        error = row["error"] if isinstance(row["error"], dict) else {}
        raise WorkflowFailedError(
            f'Workflow "{workflow_id}" failed: {error.get("type", "Error")}: {error.get("message", "")}',
            error,
        )
    if status == WorkflowStatus.CANCELLED:
        reason = f": {row['cancel_reason']}" if row["cancel_reason"] else ""
        raise WorkflowCancelledError(f'Workflow "{workflow_id}" was cancelled{reason}.')
    raise WorkflowTimedOutError(
        f'Workflow "{workflow_id}" timed out: its execution deadline ({row["execution_deadline"]}) passed.'
    )


# ------------------------------------------------------------------------------------------ handle


class WorkflowHandle:
    """A reference to workflow ``id`` (its latest run). Cheap: every method reads or writes fresh.

    ``id`` is checked as ``weft.start`` checks it: InvalidWorkflowIdError for an id no run can have."""

    __slots__ = ("id",)

    def __init__(self, id: str) -> None:
        self.id = validate_workflow_id(id)

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.id!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkflowHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash((WorkflowHandle, self.id))

    @property
    def status(self) -> WorkflowStatus | str:
        """The run's status, read from the database now (the stored text when it is not a
        WorkflowStatus: a row written by hand or by another version)."""
        status = Workflow.objects.using(_alias()).filter(pk=self.id).values_list("status", flat=True).first()
        if status is None:
            raise WorkflowNotFoundError(f'No workflow "{self.id}" exists (never started, or purged).')
        return _status(status)

    def describe(self) -> dict[str, Any]:
        """id, status, workflow_type, version, run_id, owner_engine, epoch, claim_expires_at,
        created_at, started_at, finished_at, current_step, pending_timers (one query).

        ``status`` is a WorkflowStatus, or the stored text for a status weft does not know (an odd
        row). A timestamp the row holds but Python cannot represent (before year 1, past year 9999,
        ``'infinity'``: a hand edit) is None, and ``"unreadable"`` maps its key to the stored text (the
        key is there only then). Raises WorkflowNotFoundError for an unknown id."""
        using = _alias()
        claim = WorkflowClaim.objects.using(using).filter(pk=OuterRef("pk"))
        last_step = Step.objects.using(using).filter(run_id=OuterRef("run_id")).order_by("-seq")
        annotated = (
            Workflow.objects.using(using)
            .filter(pk=self.id)
            .annotate(
                owner_engine=Subquery(claim.values("engine_id")[:1]),
                epoch=Subquery(claim.values("epoch")[:1]),
                claim_expires_at=Subquery(claim.values("expires_at")[:1]),
                pending_timers=runs.pending_timers(using),
                last_seq=Subquery(last_step.values("seq")[:1]),
                last_kind=Subquery(last_step.values("kind")[:1]),
                last_name=Subquery(last_step.values("name")[:1]),
            )
        )
        # A timestamp Python cannot represent (a hand edit): None, named under "unreadable".
        names = (*SUMMARY_FIELDS, "last_seq", "last_kind", "last_name")
        row = readable_values(annotated, names, moments=("claim_expires_at",)).first()
        if row is None:
            raise WorkflowNotFoundError(f'No workflow "{self.id}" exists (never started, or purged).')
        described: dict[str, Any] = dict(row)
        last_seq, last_kind, last_name = (described.pop(key) for key in ("last_seq", "last_kind", "last_name"))
        if not described["current_step"]:
            described["current_step"] = (
                None if last_seq is None else f"#{last_seq} {last_kind}" + (f" {last_name}" if last_name else "")
            )
        described["status"] = _status(described["status"])
        return described

    def signal(self, name: str, payload: Any = None, *, signal_id: str | None = None) -> None:
        """Send a signal (see :func:`signal`)."""
        signal(self.id, name, payload, signal_id=signal_id)

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the run, storing ``reason`` (None, or a str of at most 1000 characters) with it.

        Raises InvalidArgumentError for a bad reason (nothing is written), WorkflowTerminalError if the
        run already ended and WorkflowNotFoundError for an unknown id."""
        transitions.cancel(self.id, validate_reason(reason), using=_alias())

    def suspend(self) -> None:
        """running -> suspended; WorkflowStateError otherwise."""
        transitions.suspend(self.id, using=_alias())

    def resume(self) -> None:
        """suspended -> running; WorkflowStateError otherwise."""
        transitions.resume(self.id, using=_alias())

    def retry(self) -> None:
        """failed -> running, same run_id, from its last checkpoint; WorkflowStateError otherwise."""
        transitions.retry(self.id, using=_alias())

    def query(self, name: str, arg: Any = _UNSET, *, timeout: Any = "5s") -> Any:
        """Ask the run a question (see :func:`query`)."""
        return query(self.id, name, arg, timeout=timeout)

    def update(self, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s") -> Any:
        """Send an update and return its handler's result (see :func:`update`)."""
        return update(self.id, name, payload, idempotency_key=idempotency_key, timeout=timeout)

    def _submit_wait(self, timeout: Any, seen: tuple[str, Any] | None = None) -> tuple[Any, Caller]:
        seconds = None if timeout is None else _duration(timeout, "timeout").total_seconds()
        return submit(wait_for_end, self.id, _alias(), seen, seconds=seconds)

    def _unstarted(self, seconds: float | None) -> Any:
        """The error of a wait that never got a weft-wait thread (``waits.finish``)."""
        within = "" if seconds is None else f" within {seconds:g}s"
        return lambda why: ResultTimeoutError(
            f'The wait for the result of workflow "{self.id}" ended{within}: {why}. The run goes on: call '
            f"result() again."
        )

    def result(self, timeout: Any = None) -> Any:
        """Wait until the run ends; return its value or raise WorkflowFailedError,
        WorkflowCancelledError or WorkflowTimedOutError.

        ``timeout`` (a duration up to ``durations.MAX_DURATION``, None: no limit) running out first
        raises WaitTimeoutError, which is also a builtin TimeoutError. A bad ``timeout`` raises
        InvalidArgumentError. Reads committed data only, on its own connection: inside a transaction
        that started this run (or a new run over a finished one) and has not committed,
        WorkflowNotFoundError."""
        alias = _alias()
        # What the caller's open transaction sees (its own uncommitted start included), to tell it apart
        # from the committed run the wait reads.
        caller_connection = transaction.get_connection(alias)
        in_transaction = caller_connection.in_atomic_block and not caller_connection.needs_rollback
        seen = runs.read_start(self.id, alias) if in_transaction else None
        future, caller = self._submit_wait(timeout, seen)
        return _outcome(self.id, finish(future, caller, self._unstarted(caller.seconds)))

    async def aresult(self, timeout: Any = None) -> Any:
        """Async twin of :meth:`result`. Cancelling the coroutine ends the wait (nothing is written)."""
        future, caller = self._submit_wait(timeout)
        return _outcome(self.id, await afinish(future, caller, self._unstarted(caller.seconds)))

    async def adescribe(self) -> dict[str, Any]:
        return await sync_to_async(self.describe)()

    async def asignal(self, name: str, payload: Any = None, *, signal_id: str | None = None) -> None:
        await sync_to_async(self.signal)(name, payload, signal_id=signal_id)

    async def acancel(self, reason: str | None = None) -> None:
        await sync_to_async(self.cancel)(reason)

    async def asuspend(self) -> None:
        await sync_to_async(self.suspend)()

    async def aresume(self) -> None:
        await sync_to_async(self.resume)()

    async def aretry(self) -> None:
        await sync_to_async(self.retry)()

    async def aquery(self, name: str, arg: Any = _UNSET, *, timeout: Any = "5s") -> Any:
        return await aquery(self.id, name, arg, timeout=timeout)

    async def aupdate(
        self, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s"
    ) -> Any:
        return await aupdate(self.id, name, payload, idempotency_key=idempotency_key, timeout=timeout)


def get_handle(id: str) -> WorkflowHandle:
    """A handle for workflow ``id``. Lazy: no query until it is used."""
    return WorkflowHandle(validate_workflow_id(id))


def cancel(id: str, reason: str | None = None) -> None:
    """Cancel workflow ``id`` (see WorkflowHandle.cancel)."""
    WorkflowHandle(id).cancel(reason)
