"""``WeftBackend``: Django's Tasks framework (``django.tasks``, or the ``django-tasks`` backport on
Django 5.2) on weft's durable workflows.

``TASKS = {"default": {"BACKEND": "weft_django.tasks.WeftBackend", "OPTIONS": {...}}}``. Each
``enqueue()`` starts one run of the ``weft_django.tasks.run`` workflow, whose one activity calls the
task; ``weft_engine`` runs it with the backend's retry policy, and the run is in the admin like any
other. Built on the public client (``weft.start``), so it joins the caller's transaction. See
docs/tasks.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import transaction
from django.utils import timezone

import weft_django as weft
from weft_django.conf import database_alias
from weft_django.exceptions import PayloadNotSerializableError, WeftError
from weft_django.registry import RetryPolicy
from weft_django.validation import start_moment, validate_workflow_id

from ._compat import (
    DEFAULT_TASK_QUEUE_NAME,
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .names import ACTIVITY_NAME, WORKFLOW_NAME  # noqa: F401  (re-exported: weft_django.tasks.backend.WORKFLOW_NAME)

USE_TZ_NEEDED = (
    "weft_django.tasks.WeftBackend needs USE_TZ = True: weft stores aware times (a run's start_at, "
    "created_at, timers), which the database backends refuse or misread with USE_TZ = False."
)
OPTION_KEYS = frozenset({"RETRY", "TIMEOUT", "EXECUTOR", "EXECUTION_TIMEOUT"})
_RETRY_FIELDS = ("max_attempts", "initial_backoff", "backoff_multiplier", "max_backoff", "non_retryable")


def _seconds(value: Any) -> Any:
    """A duration as the workflow input keeps it: timedeltas as seconds, text and numbers as given."""
    return value.total_seconds() if isinstance(value, timedelta) else value


def _retry(value: Any, alias: str) -> dict[str, Any]:
    """OPTIONS["RETRY"] (a weft.RetryPolicy or a dict of its fields) as a dict of RetryPolicy fields.
    Raises InvalidTaskBackend for anything else, or for a policy RetryPolicy refuses."""
    if value is None:
        return {}
    if isinstance(value, RetryPolicy):
        fields = {name: getattr(value, name) for name in _RETRY_FIELDS}
    elif isinstance(value, Mapping):
        unknown = set(value) - set(_RETRY_FIELDS)
        if unknown:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS']['RETRY']: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                f"a retry policy has {', '.join(_RETRY_FIELDS)}."
            )
        fields = dict(value)
    else:
        raise InvalidTaskBackend(
            f"TASKS[{alias!r}]['OPTIONS']['RETRY'] must be a weft.RetryPolicy or a dict of its fields "
            f"(got {type(value).__name__})."
        )
    try:
        RetryPolicy(**fields)
    except WeftError as exc:
        raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['RETRY']: {exc}") from None
    out = {name: _seconds(v) for name, v in fields.items() if v is not None}
    if "non_retryable" in out:
        out["non_retryable"] = list(out["non_retryable"])
        if not out["non_retryable"]:
            del out["non_retryable"]
    return out


class WeftBackend(BaseTaskBackend):
    """A durable ``django.tasks`` backend: every task is a weft workflow run with retries.

    ``supports_defer`` (``run_after`` is the run's ``start_at``), ``supports_async_task`` (a coroutine
    task runs to completion in the activity), ``supports_get_result`` (from any process, through the
    database). ``supports_priority`` is False: engines take runs in the order they become due, so a
    task with a priority other than 0 is refused with InvalidTask, as the contract says.

    OPTIONS (all optional): ``RETRY`` (a ``weft.RetryPolicy`` or a dict of its fields; weft's default:
    3 attempts, 1 s back-off doubling up to 30 s), ``TIMEOUT`` (each attempt's timeout, a weft
    duration), ``EXECUTOR`` (``"threads"`` or ``"celery"``; default: the ``WEFT`` setting's), and
    ``EXECUTION_TIMEOUT`` (the whole task's deadline, retries included). With the Celery executor a
    task's ``queue_name`` (other than ``"default"``) is the Celery queue of its attempts.

    Raises InvalidTaskBackend (an ImproperlyConfigured) for an unknown or invalid option.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = False
    weft_workflow = WORKFLOW_NAME  # what names.is_weft_backend looks for (results.py, workflows.py)

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = self.options or {}
        if not isinstance(options, Mapping):
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS'] must be a dict (got {type(options).__name__}).")
        unknown = set(options) - OPTION_KEYS
        if unknown:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS']: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                f"WeftBackend takes {', '.join(sorted(OPTION_KEYS))}."
            )
        executor = options.get("EXECUTOR")
        if executor not in (None, "threads", "celery"):
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS']['EXECUTOR'] must be \"threads\" or \"celery\" (got {executor!r})."
            )
        self.retry = _retry(options.get("RETRY"), alias)
        self.timeout = _seconds(options.get("TIMEOUT"))
        self.executor: str | None = executor
        self.execution_timeout = _seconds(options.get("EXECUTION_TIMEOUT"))

    def validate_task(self, task: Task[Any, Any]) -> None:
        """The framework's checks, then weft's bound on ``run_after``: at most ``MAX_DURATION`` (100 years)
        from now, what ``weft.start`` accepts as a ``start_at``. Raises InvalidTask, as the contract
        asks of a task the backend cannot run (from ``@task``, ``using()`` and ``enqueue()``)."""
        super().validate_task(task)
        if task.run_after is not None and task.run_after.utcoffset() is not None:
            try:
                start_moment(task.run_after, "run_after")
            except WeftError as exc:
                raise InvalidTask(str(exc)) from None

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """weft.tasks.E001 when ``weft_django`` is not in INSTALLED_APPS (nothing would run the tasks);
        weft.tasks.E002 when ``USE_TZ`` is False (weft stores aware times: enqueue refuses)."""
        found: list[checks.CheckMessage] = []
        if not settings.USE_TZ:
            found.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses weft_django.tasks.WeftBackend, but USE_TZ is False.",
                    hint="Set USE_TZ = True: weft stores aware times, and enqueue() refuses to run without it.",
                    id="weft.tasks.E002",
                )
            )
        if apps.is_installed("weft_django"):
            return found
        return [
            *found,
            checks.Error(
                f'TASKS[{self.alias!r}] uses weft_django.tasks.WeftBackend, but "weft_django" is not in '
                "INSTALLED_APPS.",
                hint='Add "weft_django" to INSTALLED_APPS, run migrate, and run engines: python manage.py weft_engine',
                id="weft.tasks.E001",
            ),
        ]

    def _request(self, task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        queue = None
        if self.executor == "celery" and task.queue_name != DEFAULT_TASK_QUEUE_NAME:
            queue = task.queue_name
        return {
            "task": task.module_path,
            "args": normalize_json(list(args)),
            "kwargs": normalize_json(dict(kwargs)),
            "takes_context": task.takes_context,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            # the moment as enqueued (get_result's task has it even when it was already past, which
            # stores no start_at); rows written before kept only whether there was one (True)
            "run_after": task.run_after.isoformat() if task.run_after is not None else None,
            "retry": self.retry,
            "timeout": self.timeout,
            "executor": self.executor,
            "queue": queue,
        }

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Start the task's workflow run; return its READY TaskResult (``id`` is the workflow id).

        Joins the caller's transaction, like ``weft.start``: inside ``transaction.atomic()`` the task
        exists (and can run) once the transaction commits, and a rollback takes it back; the
        ``task_enqueued`` signal is sent on commit. ``enqueued_at`` is the stored ``created_at`` (the
        database clock), as ``get_result`` reports it. Raises InvalidTaskBackend (an
        ImproperlyConfigured) when ``USE_TZ`` is False, InvalidTask for a task this backend cannot run, TypeError for
        arguments that are not JSON, or JSON weft cannot store exactly (NaN, an infinity, a lone
        surrogate; chained from weft's PayloadNotSerializableError), as Django's backends do, and
        weft's other errors from ``weft.start`` (PayloadSizeExceededError, ...)."""
        self.validate_task(task)
        if not isinstance(task.get_backend(), WeftBackend):
            raise InvalidTask(f"Task {task.module_path!r} is not for a WeftBackend (backend {task.backend!r}).")
        importlib.import_module("weft_django.tasks.workflows")  # registers the workflow (it imports this module)
        request = self._request(task, args, kwargs)
        using = database_alias()
        if not settings.USE_TZ:
            raise InvalidTaskBackend(USE_TZ_NEEDED)
        try:
            handle = weft.start(
                WORKFLOW_NAME,
                args=[request],
                start_at=task.run_after,
                execution_timeout=self.execution_timeout,
            )
        except PayloadNotSerializableError as exc:
            # JSON with no exact form (NaN, an infinity, a lone surrogate): the framework's TypeError.
            raise TypeError(f"Task arguments are not JSON weft can store: {exc}") from exc
        results = importlib.import_module("weft_django.tasks.results")  # imports the models: see get_result
        enqueued_at = results.enqueued_at(handle.id, using)  # the stored time, as get_result() reports it
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=handle.id,
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at or timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=request["args"],
            kwargs=request["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result), using=using)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The TaskResult of ``result_id``, read now from the database (see weft_django/tasks/results.py
        for where each field comes from). Raises TaskResultDoesNotExist for an id no task run has."""
        try:
            validate_workflow_id(result_id, "result_id")
        except WeftError:  # not a weft workflow id (empty, too long, a NUL or control character, ...)
            raise TaskResultDoesNotExist(f"No task result {result_id!r}.") from None
        # Imported here: results imports the models, and Django builds a backend as soon as a module with
        # @task is imported, which may be while the app registry is still loading.
        results = importlib.import_module("weft_django.tasks.results")
        loaded: TaskResult[Any, Any] = results.load_result(result_id, database_alias())
        return loaded
