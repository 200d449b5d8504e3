"""weft_django.tasks.WeftBackend: Django's Tasks contract (django.tasks on Django 6.x, the django-tasks
backport on 5.2) on weft workflows (issue 20)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

import weft_django as weft
from tests.testapp import tasks
from tests.testapp.models import ActivityCall
from weft_django.models import Step, Workflow
from weft_django.tasks import WORKFLOW_NAME, WeftBackend
from weft_django.tasks._compat import (
    FRAMEWORK,
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_framework_is_djangos_own_from_6_0_and_the_backport_before() -> None:
    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert expected == FRAMEWORK
    backend = task_backends["default"]
    assert isinstance(backend, WeftBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result) == (True, True, True)
    assert backend.supports_priority is False


def test_enqueue_runs_the_task_as_a_one_activity_workflow(weft_run_until_idle) -> None:
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.backend == "default" and result.args == [2, 3] and result.kwargs == {}
    assert not result.is_finished and result.attempts == 0
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018
    run = Workflow.objects.get(pk=result.id)
    assert run.workflow_type == WORKFLOW_NAME  # an ordinary run: the admin and `manage.py weft` show it
    weft_run_until_idle()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 5
    assert result.attempts == 1 and result.errors == []
    assert result.enqueued_at and result.started_at and result.finished_at and result.last_attempted_at
    assert result.enqueued_at <= result.started_at <= result.finished_at
    again = tasks.add.get_result(result.id)
    assert again.return_value == 5 and again.task.func is tasks.add.func
    assert list(Step.objects.filter(workflow_id=result.id).values_list("kind", "name", "status")) == [
        ("activity", "weft_django.tasks.call", "completed")
    ]
    assert weft.get_handle(result.id).result(timeout=5) == 5


def test_kwargs_and_queue_name(weft_run_until_idle) -> None:
    result = tasks.send_email.enqueue("a@example.com", subject="hi")
    assert result.task.queue_name == "emails"
    weft_run_until_idle()
    got = task_backends["default"].get_result(result.id)
    assert got.return_value == {"to": "a@example.com", "subject": "hi", "sent": True}
    assert got.task.queue_name == "emails" and got.kwargs == {"subject": "hi"}


def test_retries_with_the_backends_policy(weft_run_until_idle) -> None:
    result = tasks.flaky.enqueue("f1", 2)
    weft_run_until_idle()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == 3
    assert ActivityCall.objects.filter(name="task.flaky", key="f1").count() == 3


def test_a_failing_task_is_failed_with_its_error_after_the_last_attempt(weft_run_until_idle) -> None:
    result = tasks.broken.enqueue("b1")
    weft_run_until_idle()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    assert result.attempts == 3
    assert ActivityCall.objects.filter(name="task.broken", key="b1").count() == 3
    assert len(result.errors) == 1
    error = result.errors[0]
    assert error.exception_class is ValueError
    assert "broken b1" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018
    assert result.finished_at is not None


def test_a_second_backend_with_its_own_options(weft_run_until_idle) -> None:
    result = tasks.broken_once.enqueue("o1")
    assert result.backend == "once"
    weft_run_until_idle()
    got = task_backends["once"].get_result(result.id)
    assert got.status == TaskResultStatus.FAILED and got.attempts == 1
    assert ActivityCall.objects.filter(name="task.broken_once").count() == 1


def test_takes_context_sees_the_attempt(weft_run_until_idle) -> None:
    result = tasks.with_context.enqueue("c1")
    weft_run_until_idle()
    result.refresh()
    assert result.return_value == {"attempt": 2, "id": result.id, "status": "RUNNING"}
    assert result.attempts == 2


def test_an_async_task(weft_run_until_idle) -> None:
    result = tasks.async_double.enqueue(21)
    weft_run_until_idle()
    result.refresh()
    assert result.return_value == 42


def test_run_after_defers_the_start(weft_run_until_idle, weft_clock) -> None:
    when = weft_clock.now() + dt.timedelta(hours=1)
    result = tasks.add.using(run_after=when).enqueue(1, 1)
    weft_run_until_idle()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert Workflow.objects.get(pk=result.id).status == "pending"
    assert result.task.run_after == when
    weft_clock.advance(dt.timedelta(hours=1, seconds=1))
    weft_run_until_idle()
    result.refresh()
    assert result.return_value == 2


def test_a_return_value_that_is_not_json_fails_the_task(weft_run_until_idle) -> None:
    result = task_backends["once"].enqueue(tasks.not_json.using(backend="once"), (), {})
    weft_run_until_idle()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError


def test_arguments_that_are_not_json_are_refused_before_anything_is_stored() -> None:
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    assert not Workflow.objects.exists()


def test_validation_follows_the_contract() -> None:
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=10)
    with pytest.raises(InvalidTask, match="Queue"):
        tasks.add.using(queue_name="nope")
    with pytest.raises(InvalidTask, match="aware"):
        with_naive = dt.datetime(2030, 1, 1)
        tasks.add.using(run_after=with_naive)

    def local(x: int) -> int:
        return x

    with pytest.raises(InvalidTask, match="module level"):
        task(local)

    def no_context(key: str) -> None: ...

    no_context.__qualname__ = "no_context"  # looks module-level; the context argument is what is missing
    with pytest.raises(InvalidTask, match="context"):
        task(takes_context=True)(no_context)


def test_enqueue_joins_the_callers_transaction() -> None:
    sent: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            rolled_back = tasks.add.enqueue(1, 2)
            assert sent == []  # sent on commit
            raise RuntimeError("roll back")
        with pytest.raises(TaskResultDoesNotExist):
            tasks.add.get_result(rolled_back.id)
        assert sent == []
        with transaction.atomic():
            kept = tasks.add.enqueue(1, 2)
        assert sent == [kept.id]
        assert tasks.add.get_result(kept.id).status == TaskResultStatus.READY
    finally:
        task_enqueued.disconnect(receiver)


def test_started_and_finished_signals(weft_run_until_idle) -> None:
    seen: list[tuple[str, str, int]] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("started", str(task_result.status), task_result.attempts))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("finished", str(task_result.status), task_result.attempts))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        tasks.flaky.enqueue("s1", 1)
        weft_run_until_idle()
        tasks.broken_once.enqueue("s2")
        weft_run_until_idle()
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert seen == [
        ("started", "RUNNING", 1),
        ("started", "RUNNING", 2),
        ("finished", "SUCCESSFUL", 2),
        ("started", "RUNNING", 1),
        ("finished", "FAILED", 1),
    ]


def test_aenqueue_and_aget_result(weft_run_until_idle) -> None:
    result = async_to_sync(tasks.add.aenqueue)(4, 4)
    weft_run_until_idle()
    got = async_to_sync(tasks.add.aget_result)(result.id)
    assert got.return_value == 8
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_get_result_of_an_unknown_id_or_of_a_workflow_that_is_no_task() -> None:
    backend = task_backends["default"]
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("no-such-task")
    handle = weft.start("tests.sum", args=[1, 2])
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(handle.id)


def test_cancelled_task_is_failed(weft_run_until_idle, weft_clock) -> None:
    result = tasks.add.using(run_after=weft_clock.now() + dt.timedelta(hours=1)).enqueue(1, 1)
    weft.cancel(result.id, "not needed")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is weft.WorkflowCancelledError


def test_options_are_validated() -> None:
    with pytest.raises(InvalidTaskBackend, match="unknown key"):
        WeftBackend("x", {"OPTIONS": {"RETRIES": 3}})
    with pytest.raises(InvalidTaskBackend, match="RETRY"):
        WeftBackend("x", {"OPTIONS": {"RETRY": {"max_attempts": 0}}})
    with pytest.raises(InvalidTaskBackend, match="EXECUTOR"):
        WeftBackend("x", {"OPTIONS": {"EXECUTOR": "processes"}})
    backend = WeftBackend("x", {"OPTIONS": {"RETRY": weft.RetryPolicy(max_attempts=5), "TIMEOUT": "5s"}})
    assert backend.retry == {"max_attempts": 5} and backend.timeout == "5s"


def test_check_says_what_to_add_without_the_app(monkeypatch) -> None:
    backend = task_backends["default"]
    assert list(backend.check()) == []
    monkeypatch.setattr("django.apps.apps.is_installed", lambda name: False)
    (error,) = backend.check()
    assert error.id == "weft.tasks.E001" and '"weft_django"' in error.msg


@pytest.mark.subprocess
def test_weft_engine_runs_enqueued_tasks(weft_engines) -> None:
    result = tasks.flaky.enqueue("p1", 1)
    engine = weft_engines()
    try:
        weft.get_handle(result.id).result(timeout=60)
    finally:
        engine.stop()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 2
    assert result.attempts == 2 and result.worker_ids == [engine.engine_id] * 2
    assert timezone.is_aware(result.finished_at)


def test_only_a_weft_backend_or_a_subclass_counts_as_one() -> None:
    """tasks/names.is_weft_backend, which results.py and workflows.py use instead of importing
    WeftBackend from backend.py (which loads them)."""
    from weft_django.tasks._compat import BaseTaskBackend
    from weft_django.tasks.names import is_weft_backend

    class Subclass(WeftBackend):
        pass

    class Other(BaseTaskBackend):
        def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
            raise NotImplementedError

    assert is_weft_backend(task_backends["default"])
    assert is_weft_backend(Subclass("sub", {"OPTIONS": {}}))
    assert not is_weft_backend(Other("other", {}))
    assert not is_weft_backend(WeftBackend)  # the class itself is no backend
