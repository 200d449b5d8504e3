"""weft_django.tasks against what docs/tasks.md and the Tasks framework promise, found by a review (each
test failing on the code before its fix): the ``task`` of a TaskResult keeps the ``run_after`` it was
enqueued with, a cancelled or timed-out task says so in its errors after a failed attempt, and a
``run_after`` weft cannot store is refused by ``validate_task`` with InvalidTask."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

import weft_django as weft
from tests.testapp import tasks
from weft_django.durations import MAX_DURATION
from weft_django.models import Step, Workflow
from weft_django.tasks._compat import InvalidTask, TaskResultStatus
from weft_django.testing import running_engine

pytestmark = pytest.mark.django_db(transaction=True)

# tests/settings.py's "default" backend, with a back-off long enough to cancel a task between attempts.
SLOW_RETRY = {
    "default": {
        "BACKEND": "weft_django.tasks.WeftBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"RETRY": {"max_attempts": 3, "initial_backoff": "1h", "max_backoff": "2h"}},
    },
}


def _wait(condition: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_get_result_keeps_a_run_after_in_the_past(weft_run_until_idle) -> None:
    """docs/tasks.md: a TaskResult's ``task`` has the ``run_after`` it was enqueued with. A moment already
    past starts the run at once (no stored start_at), and get_result() lost it."""
    when = timezone.now() - dt.timedelta(hours=1)
    result = tasks.add.using(run_after=when).enqueue(1, 1)
    assert result.task.run_after == when
    assert tasks.add.get_result(result.id).task.run_after == when
    weft_run_until_idle()
    done = tasks.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 2
    assert done.task.run_after == when
    assert tasks.add.get_result(tasks.add.enqueue(2, 2).id).task.run_after is None


def test_a_task_cancelled_between_attempts_says_it_was_cancelled() -> None:
    """docs/tasks.md: a cancelled task is FAILED with WorkflowCancelledError. After a failed attempt its
    errors held only that attempt's ConnectionError, as if the task had failed on its own."""
    with override_settings(TASKS=SLOW_RETRY), running_engine():
        result = tasks.flaky.enqueue("cancelled-between", 5)
        _wait(lambda: Step.objects.filter(workflow_id=result.id).exclude(error=None).exists())
        result.refresh()
        assert result.status == TaskResultStatus.READY
        assert [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"]
        weft.cancel(result.id, "not needed")
        _wait(lambda: Workflow.objects.get(pk=result.id).status == "cancelled")
        result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [
        "builtins.ConnectionError",
        "weft_django.exceptions.WorkflowCancelledError",
    ]
    assert result.errors[-1].exception_class is weft.WorkflowCancelledError


@pytest.mark.parametrize("years", [101, 8000])
def test_a_run_after_weft_cannot_store_is_an_invalid_task(years: int) -> None:
    """The Tasks framework: validate_task raises InvalidTask for a task the backend cannot run (at
    ``using()``, as for a naive run_after). A run_after past weft's MAX_DURATION got through, and
    enqueue() raised weft's InvalidArgumentError instead."""
    when = timezone.now() + min(dt.timedelta(days=365 * years), dt.datetime.max.replace(tzinfo=dt.UTC) - timezone.now())
    assert when - timezone.now() > MAX_DURATION
    with pytest.raises(InvalidTask, match="run_after"):
        tasks.add.using(run_after=when)
    assert not Workflow.objects.exists()
    soon = tasks.add.using(run_after=timezone.now() + dt.timedelta(days=365 * 50))  # within the bound: accepted
    assert soon.enqueue(1, 2).status == TaskResultStatus.READY
