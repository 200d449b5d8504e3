"""The one workflow every ``django.tasks`` task becomes: a run of ``weft_django.tasks.run`` with one
activity, ``weft_django.tasks.call``, that imports the task by its module path and calls it.

Imported by ``WeftConfig.ready()`` when ``settings.TASKS`` names ``WeftBackend`` or a subclass, so
every engine and Celery worker of such a project knows both names without a ``workflows.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import weft_django as weft
from weft_django import codec
from weft_django.activity_runtime import current_control
from weft_django.conf import database_alias
from weft_django.exceptions import PayloadNotSerializableError, PayloadSizeExceededError
from weft_django.registry import RetryPolicy

from ._compat import TaskContext, normalize_json, task_finished, task_started
from .names import ACTIVITY_NAME, WORKFLOW_NAME
from .results import TaskNotFoundError, attempt_result, resolve_task

logger = logging.getLogger(__name__)
NOT_FOUND = f"{TaskNotFoundError.__module__}.{TaskNotFoundError.__qualname__}"
# Never retried: a missing task stays missing, and a return value weft cannot store (NaN, too large)
# would be refused again after the task's body ran again.
NEVER_RETRIED = (
    NOT_FOUND,
    f"{PayloadNotSerializableError.__module__}.{PayloadNotSerializableError.__qualname__}",
    f"{PayloadSizeExceededError.__module__}.{PayloadSizeExceededError.__qualname__}",
)


def retry_policy(request: dict[str, Any]) -> RetryPolicy:
    """The retry policy of a task's attempts: the backend's as enqueued, with ``NEVER_RETRIED`` added."""
    retry = dict(request["retry"])
    retry["non_retryable"] = [*retry.get("non_retryable", ()), *NEVER_RETRIED]
    return RetryPolicy(**retry)


def _stopped() -> bool:
    """Whether the engine asked this attempt to stop (it timed out, its run was cancelled or its engine
    deposed): the engine no longer waits for its outcome, so it sends no ``task_finished``."""
    control = current_control()
    return control is not None and control.stop_reason is not None


@weft.activity(name=ACTIVITY_NAME)
def call_task(request: dict[str, Any]) -> Any:
    """One attempt of a task: import it, send ``task_started``, call it (with a TaskContext when it takes
    one), send ``task_finished`` when it succeeded or failed for the last time.

    The return value must be JSON, as the Tasks framework requires (tuples become lists), and storable
    by weft (no NaN or infinity, within ``PAYLOAD_MAX_BYTES``): it is encoded here, before
    ``task_finished`` is sent, as the engine stores it; anything else fails the attempt (TypeError,
    PayloadNotSerializableError, PayloadSizeExceededError; the last two are not retried). An attempt
    the engine stopped (timed out, cancelled) sends no ``task_finished``; a receiver's error is logged,
    not the attempt's (the task's outcome stands: it is not run again). Raises TaskNotFoundError when
    the task's module path no longer names a Task of a WeftBackend, and whatever the task raises."""
    info = weft.activity_info()
    task = resolve_task(request["task"])
    policy = retry_policy(request)
    using = database_alias()
    sender = type(task.get_backend())  # a WeftBackend (resolve_task refuses any other)
    result = attempt_result(info.workflow_id, using, info.attempt)
    task_started.send(sender=sender, task_result=result)
    try:
        if request["takes_context"]:
            value = task.call(TaskContext(task_result=result), *request["args"], **request["kwargs"])
        else:
            value = task.call(*request["args"], **request["kwargs"])
        value = normalize_json(value)
        codec.encode_payload(value, path="activity result")  # refused here, not after task_finished
    except BaseException as exc:
        last = info.attempt >= policy.attempts or not policy.is_retryable(exc)
        if last and not _stopped():
            _finished(sender, info.workflow_id, using, info.attempt, error=exc)
        raise
    if not _stopped():
        _finished(sender, info.workflow_id, using, info.attempt, value=value)
    return value


def _finished(sender: type, result_id: str, using: str, attempt: int, **outcome: Any) -> None:
    """Send ``task_finished`` for the attempt's outcome (``value=`` or ``error=``). The task's body has
    run: an error here (a receiver's, or reading the result) is logged, never the attempt's outcome,
    which would retry a task that succeeded (its body run again) or replace the error it raised."""
    try:
        ended = attempt_result(result_id, using, attempt, finished=True, **outcome)
        task_finished.send(sender=sender, task_result=ended)
    except Exception:
        logger.exception("task_finished failed for task %s (attempt %s); the task's outcome stands", result_id, attempt)


@weft.workflow(name=WORKFLOW_NAME)
def run_task(ctx: weft.WorkflowContext, request: dict[str, Any]) -> Generator[Any, Any, Any]:
    """The workflow of one enqueued task: its one activity, with the backend's retry policy (plus
    ``NEVER_RETRIED``), timeout and executor as they were when it was enqueued."""
    options: dict[str, Any] = {"retry": retry_policy(request)}
    for key in ("timeout", "executor", "queue"):
        if request.get(key) is not None:
            options[key] = request[key]
    return (yield ctx.run(call_task.options(**options), request))
