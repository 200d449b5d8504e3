"""A task's ``TaskResult``, read from its workflow run: the run row, its one activity step and its claim.

| TaskResult        | from                                                                            |
|-------------------|---------------------------------------------------------------------------------|
| id                | the workflow id                                                                 |
| status            | READY: not started, waiting for ``run_after``, between retries or suspended;    |
|                   | RUNNING: an attempt is running and an engine holds the run (its claim has not   |
|                   | lapsed: store/claims/lapse.py); SUCCESSFUL: completed; FAILED: failed,          |
|                   | cancelled or timed out                                                          |
| enqueued_at       | the run's ``created_at``                                                        |
| started_at        | when the first attempt began (the step's ``started_at``)                        |
| last_attempted_at | the step's ``completed_at`` once it ended, else when its latest attempt began:  |
|                   | its ``started_at`` (attempt 1) or when the engine dispatched the latest retry   |
|                   | (``next_attempt_at``, kept with the failed attempt's error)                     |
| finished_at       | the run's ``finished_at``                                                       |
| errors            | the step's recorded error: the last failed attempt's, kept while the task is    |
|                   | retried and after it succeeded on a retry (weft keeps the last one, not one per |
|                   | attempt), then, for a cancelled or timed-out run, why it ended                  |
| worker_ids        | the engine that holds (or last held) the run, once per attempt                  |
| return_value      | the run's result                                                                |
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from weft_django import codec
from weft_django.conf import get_settings
from weft_django.exceptions import CorruptPayloadError
from weft_django.models import Engine, Step, Timer, Workflow, WorkflowClaim
from weft_django.status import StepStatus, TimerKind, WorkflowStatus
from weft_django.store.claims import has_lapsed
from weft_django.store.clock import db_clock
from weft_django.store.moments import readable

from ._compat import Task, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus
from .names import WORKFLOW_NAME, is_weft_backend

_FAILED = {WorkflowStatus.FAILED, WorkflowStatus.CANCELLED, WorkflowStatus.TIMED_OUT}
_ENDED_ERRORS = {
    WorkflowStatus.CANCELLED: "weft_django.exceptions.WorkflowCancelledError",
    WorkflowStatus.TIMED_OUT: "weft_django.exceptions.WorkflowTimedOutError",
    WorkflowStatus.FAILED: "weft_django.exceptions.WorkflowFailedError",
}


class TaskNotFoundError(LookupError):
    """A task's module path does not name a ``django.tasks`` Task run by a WeftBackend (renamed, removed,
    or a row not written by ``enqueue``)."""


def resolve_task(path: str) -> Task[Any, Any]:
    """The Task object at ``path`` (``module.qualname``, ``Task.module_path``).

    Raises TaskNotFoundError when it cannot be imported, is not a Task, or its backend is not a
    WeftBackend: only functions decorated with ``@task`` for this backend are ever called."""
    try:
        found = import_string(path)
    except ImportError as exc:
        raise TaskNotFoundError(f"Task {path!r} cannot be imported: {exc}") from exc
    if not isinstance(found, Task):
        raise TaskNotFoundError(f"{path!r} is not a django.tasks Task (decorate the function with @task).")
    if not is_weft_backend(found.get_backend()):
        raise TaskNotFoundError(f"Task {path!r} runs on backend {found.backend!r}, which is not a WeftBackend.")
    return found


def _task_of(request: dict[str, Any], run_after: datetime | None) -> Task[Any, Any]:
    task = resolve_task(request["task"])
    changes: dict[str, Any] = {}
    if request.get("queue_name") not in (None, task.queue_name):
        changes["queue_name"] = request["queue_name"]
    if request.get("priority") not in (None, task.priority):
        changes["priority"] = request["priority"]
    if run_after is not None and run_after != task.run_after:
        changes["run_after"] = run_after
    if request.get("backend") not in (None, task.backend):
        changes["backend"] = request["backend"]
    return task.using(**changes) if changes else task


def _run_after(request: Mapping[str, Any], start_at: datetime | None) -> datetime | None:
    """The ``run_after`` the task was enqueued with: the moment ``enqueue`` kept in the request, else
    (a row of an older release, which kept only whether there was one) the run's stored ``start_at``."""
    value = request.get("run_after")
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:  # a damaged row: what the run stored
            return start_at
        return moment if moment.utcoffset() is not None else start_at
    return start_at if value else None


def _error(error: Any) -> TaskError:
    data = error if isinstance(error, dict) else {}
    path = str(data.get("qualified_type") or data.get("type") or "Exception")
    if "." not in path:
        path = f"builtins.{path}"
    text = str(data.get("traceback") or f"{data.get('type', 'Exception')}: {data.get('message', '')}\n")
    return TaskError(exception_class_path=path, traceback=text)


def _last_attempted(step: Mapping[str, Any]) -> datetime | None:
    """When the step last changed (``completed_at``), else when its latest attempt began: a retry's
    dispatch time, which the engine keeps in the failed attempt's error (``next_attempt_at``), else the
    step's ``started_at``."""
    if step["completed_at"] is not None:
        ended: datetime = step["completed_at"]
        return ended
    error = step["error"] if isinstance(step["error"], dict) else {}
    began: datetime | None = step["started_at"]  # None: a time Python cannot hold (a hand edit)
    retried = error.get("next_attempt_at")
    if isinstance(retried, str):
        try:
            moment = datetime.fromisoformat(retried)
        except (TypeError, ValueError):
            return began
        return moment if began is None else max(began, moment)
    return began


def _request_of(input_text: Any) -> dict[str, Any] | None:
    """The request ``enqueue`` wrote as the run's one argument, or None when the run's input does not
    have its shape (a run of the task workflow started some other way, or a damaged row)."""
    try:
        payload = codec.decode(input_text)
    except CorruptPayloadError:  # an undecodable input is not enqueue()'s either
        return None
    args = payload.get("args") if isinstance(payload, dict) else None
    request = args[0] if isinstance(args, list) and len(args) == 1 else None
    if not isinstance(request, dict):
        return None
    shaped = (
        isinstance(request.get("task"), str)
        and isinstance(request.get("args"), list)
        and isinstance(request.get("kwargs"), dict)
        and isinstance(request.get("takes_context"), bool)
        and isinstance(request.get("retry"), dict)
        and isinstance(request.get("backend"), str | None)
    )
    return request if shaped else None


def _moments(*names: str) -> dict[str, Any]:
    """``values()`` keyword arguments reading these timestamp columns through ``readable`` (as
    ``m_<name>``: an annotation may not take a field's name); ``_renamed`` gives them their names back."""
    return {f"m_{name}": readable(name) for name in names}


def _renamed(row: Any) -> Any:
    return None if row is None else {name[2:] if name.startswith("m_") else name: value for name, value in row.items()}


def enqueued_at(result_id: str, using: str) -> datetime | None:
    """The stored ``created_at`` of task run ``result_id`` (the database clock), or None when there is
    no such row: what ``TaskResult.enqueued_at`` is, from ``enqueue`` as from ``get_result``."""
    created: datetime | None = (
        Workflow.objects.using(using).filter(pk=result_id).values_list(readable("created_at"), flat=True).first()
    )
    return created


def _held(claim: tuple[str | None, str | None, datetime | None] | None, using: str) -> bool:
    """Whether an engine holds the run's claim and it has not lapsed (store/claims/lapse.py's rule,
    read-only): an attempt of a run whose engine died is not running, whatever its step says."""
    if claim is None or claim[0] is None:
        return False
    heartbeat = Engine.objects.using(using).filter(pk=claim[0]).values_list(readable("heartbeat_at"), flat=True).first()
    return not has_lapsed(claim[2], heartbeat, db_clock(using), get_settings().workflow_claim_ttl)


def load_result(result_id: str, using: str) -> TaskResult[Any, Any]:
    """The TaskResult of task run ``result_id`` on database ``using``.

    Raises TaskResultDoesNotExist when no task run has that id (never enqueued, purged, or a workflow that
    is not a task), or when its task can no longer be imported."""
    # Timestamps through readable(): one a hand edit put out of Python's reach (past year 9999) is None
    # in the TaskResult, not a DataError from get_result().
    row = _renamed(
        Workflow.objects.using(using)
        .filter(pk=result_id, workflow_type=WORKFLOW_NAME)
        .values(
            "id", "run_id", "status", "input", "result", "error", **_moments("start_at", "created_at", "finished_at")
        )
        .first()
    )
    if row is None:
        raise TaskResultDoesNotExist(f"No task result {result_id!r} (never enqueued, or purged).")
    request = _request_of(row["input"])
    if request is None:
        raise TaskResultDoesNotExist(f"Task result {result_id!r} exists, but its run was not started by enqueue().")
    try:
        task = _task_of(request, _run_after(request, row["start_at"]))
    except TaskNotFoundError as exc:
        raise TaskResultDoesNotExist(f"Task result {result_id!r} exists, but {exc}") from exc
    step = _renamed(
        Step.objects.using(using)
        .filter(workflow_id=result_id, run_id=row["run_id"], seq=0)
        .values("status", "error", "attempts", **_moments("started_at", "completed_at"))
        .first()
    )
    claim = (
        WorkflowClaim.objects.using(using)
        .filter(pk=result_id)
        .values_list("engine_id", "last_engine_id", readable("expires_at"))
        .first()
    )
    engine = next((name for name in (claim or ())[:2] if name), "weft")
    status = row["status"]
    errors: list[TaskError] = []
    if step is not None and step["error"]:
        errors.append(_error(step["error"]))
    if status == WorkflowStatus.COMPLETED:
        state = TaskResultStatus.SUCCESSFUL
    elif status in _FAILED:
        state = TaskResultStatus.FAILED
        # A failed run's error is its last attempt's (already there); a cancelled or timed-out one ends
        # with why it ended, after the error of an attempt that failed before (docs/tasks.md).
        if not errors or status != WorkflowStatus.FAILED:
            ended = row["error"] if isinstance(row["error"], dict) else {"message": f"the run was {status}"}
            errors.append(_error({**ended, "qualified_type": _ENDED_ERRORS[WorkflowStatus(status)]}))
    elif (
        step is not None
        and step["status"] == StepStatus.RUNNING
        and status == WorkflowStatus.RUNNING
        and not Timer.objects.using(using).filter(workflow_id=result_id, kind=TimerKind.ACTIVITY_RETRY).exists()
        and _held(claim, using)
    ):
        state = TaskResultStatus.RUNNING
    else:
        state = TaskResultStatus.READY
    attempts = step["attempts"] if step is not None else 0
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=row["id"],
        status=state,
        enqueued_at=row["created_at"],
        started_at=step["started_at"] if step is not None else None,
        finished_at=row["finished_at"],
        last_attempted_at=_last_attempted(step) if step is not None else None,
        args=request["args"],
        kwargs=request["kwargs"],
        backend=request.get("backend") or task.backend,
        errors=errors,
        worker_ids=[engine] * attempts,
    )
    if state == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", codec.decode(row["result"]))
    return result


def attempt_result(
    result_id: str,
    using: str,
    attempt: int,
    *,
    value: Any = None,
    error: BaseException | None = None,
    finished: bool = False,
) -> TaskResult[Any, Any]:
    """The TaskResult an attempt sees (``TaskContext.task_result``) and sends with ``task_started`` /
    ``task_finished``: the stored one, RUNNING at attempt ``attempt``, or SUCCESSFUL with ``value`` /
    FAILED with ``error`` once ``finished``."""
    stored = load_result(result_id, using)
    now = timezone.now()
    workers = list(stored.worker_ids[:attempt])
    workers += [workers[-1] if workers else "weft"] * (attempt - len(workers))
    state = TaskResultStatus.RUNNING
    errors = list(stored.errors)
    if finished:
        state = TaskResultStatus.FAILED if error is not None else TaskResultStatus.SUCCESSFUL
        if error is not None:
            path = f"{type(error).__module__}.{type(error).__qualname__}"
            text = "".join(traceback.format_exception(error))
            errors = [*errors, TaskError(exception_class_path=path, traceback=text)]
    result: TaskResult[Any, Any] = TaskResult(
        task=stored.task,
        id=stored.id,
        status=state,
        enqueued_at=stored.enqueued_at,
        started_at=stored.started_at or now,
        finished_at=now if finished else None,
        last_attempted_at=now,
        args=stored.args,
        kwargs=stored.kwargs,
        backend=stored.backend,
        errors=errors,
        worker_ids=workers,
    )
    if finished and error is None:
        object.__setattr__(result, "_return_value", value)
    return result
