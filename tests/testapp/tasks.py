"""django.tasks tasks for tests/client/test_tasks.py, on weft_django.tasks.WeftBackend (tests/settings.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from weft_django.tasks._compat import TaskContext, task

from .models import ActivityCall


def _count(name: str, key: str = "") -> int:
    ActivityCall.objects.create(name=name, key=key)
    return ActivityCall.objects.filter(name=name, key=key).count()


@task
def add(a: int, b: int) -> int:
    _count("task.add")
    return a + b


@task(queue_name="emails")
def send_email(to: str, *, subject: str = "") -> dict[str, Any]:
    return {"to": to, "subject": subject, "sent": True}


@task
def flaky(key: str, failures: int) -> int:
    """Fails ``failures`` times for ``key``, then returns how many calls it took."""
    calls = _count("task.flaky", key)
    if calls <= failures:
        raise ConnectionError(f"attempt {calls} for {key} failed")
    return calls


@task
def broken(key: str) -> None:
    _count("task.broken", key)
    raise ValueError(f"broken {key}")


@task(backend="once")
def broken_once(key: str) -> None:
    _count("task.broken_once", key)
    raise ValueError(f"broken once {key}")


@task(takes_context=True)
def with_context(context: TaskContext[Any, Any], key: str) -> dict[str, Any]:
    calls = _count("task.with_context", key)
    if calls == 1:
        raise ConnectionError("first attempt fails")
    return {"attempt": context.attempt, "id": context.task_result.id, "status": str(context.task_result.status)}


@task
async def async_double(value: int) -> int:
    await asyncio.sleep(0)
    return value * 2


@task
def not_json() -> object:
    return object()
