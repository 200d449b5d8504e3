"""The one workflow every ``django.tasks`` task becomes: a run of ``weft_django.tasks.run`` with one
activity, ``weft_django.tasks.call``, that imports the task by its module path and calls it.

Imported by ``WeftConfig.ready()`` when ``settings.TASKS`` names ``weft_django.tasks.WeftBackend``, so
every engine and Celery worker of such a project knows both names without a ``workflows.py``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import weft_django as weft
from weft_django.conf import database_alias
from weft_django.registry import RetryPolicy

from ._compat import TaskContext, normalize_json, task_finished, task_started
from .names import ACTIVITY_NAME, WORKFLOW_NAME
from .results import TaskNotFoundError, attempt_result, resolve_task

NOT_FOUND = f"{TaskNotFoundError.__module__}.{TaskNotFoundError.__qualname__}"


@weft.activity(name=ACTIVITY_NAME)
def call_task(request: dict[str, Any]) -> Any:
    """One attempt of a task: import it, send ``task_started``, call it (with a TaskContext when it takes
    one), send ``task_finished`` when it succeeded or failed for the last time.

    The return value must be JSON, as the Tasks framework requires (tuples become lists); anything else
    fails the attempt with TypeError. Raises TaskNotFoundError when the task's module path no longer
    names a Task of a WeftBackend, and whatever the task raises."""
    info = weft.activity_info()
    task = resolve_task(request["task"])
    policy = RetryPolicy(**request["retry"])
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
    except BaseException as exc:
        if info.attempt >= policy.attempts or not policy.is_retryable(exc):
            ended = attempt_result(info.workflow_id, using, info.attempt, error=exc, finished=True)
            task_finished.send(sender=sender, task_result=ended)
        raise
    ended = attempt_result(info.workflow_id, using, info.attempt, value=value, finished=True)
    task_finished.send(sender=sender, task_result=ended)
    return value


@weft.workflow(name=WORKFLOW_NAME)
def run_task(ctx: weft.WorkflowContext, request: dict[str, Any]) -> Generator[Any, Any, Any]:
    """The workflow of one enqueued task: its one activity, with the backend's retry policy, timeout and
    executor as they were when it was enqueued."""
    retry = dict(request["retry"])
    retry["non_retryable"] = [*retry.get("non_retryable", ()), NOT_FOUND]  # a missing task stays missing
    options: dict[str, Any] = {"retry": RetryPolicy(**retry)}
    for key in ("timeout", "executor", "queue"):
        if request.get(key) is not None:
            options[key] = request[key]
    return (yield ctx.run(call_task.options(**options), request))
