"""weft_django.tasks: a ``task_finished`` receiver that raises (a monitoring hook whose service is down)
is not the task's outcome. The signal is sent in the attempt, after the task's body returned or raised;
its error used to become the attempt's: a task that had succeeded was retried, its body run again up
to the backend's ``max_attempts``, then reported FAILED with the receiver's error; a task that failed
reported the receiver's error instead of its own. Each test failed on the code before its fix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.testapp import tasks
from tests.testapp.models import ActivityCall
from weft_django.tasks._compat import TaskResultStatus, task_finished

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def failing_receiver() -> Iterator[list[str]]:
    """A task_finished receiver that records the status it saw, then raises."""
    seen: list[str] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(str(task_result.status))
        raise RuntimeError("the monitoring service is down")

    task_finished.connect(receiver, weak=False)
    try:
        yield seen
    finally:
        task_finished.disconnect(receiver)


def test_a_receiver_that_raises_does_not_run_a_task_that_succeeded_again(weft_run_until_idle, failing_receiver) -> None:
    result = tasks.add.enqueue(1, 2)
    weft_run_until_idle()
    result.refresh()
    calls = ActivityCall.objects.filter(name="task.add").count()
    assert (result.status, calls) == (TaskResultStatus.SUCCESSFUL, 1), (
        f"status {result.status}, the task's body ran {calls} times, errors "
        f"{[e.exception_class_path for e in result.errors]}"
    )
    assert result.return_value == 3 and result.errors == []
    assert failing_receiver == ["SUCCESSFUL"]


def test_a_receiver_that_raises_does_not_replace_the_tasks_own_error(weft_run_until_idle, failing_receiver) -> None:
    result = tasks.broken_once.enqueue("r1")
    weft_run_until_idle()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]
    assert failing_receiver == ["FAILED"]
