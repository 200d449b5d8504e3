"""Faults of weft_django.tasks (the django.tasks backend) found by a review, each test failing on the
code before its fix: what a retried task reports, task_finished for an attempt that then fails, inputs
enqueue() and get_result() must refuse as the Tasks framework says, a WeftBackend subclass, a task that
raises SystemExit, a task whose engine died, a task run not written by enqueue().

Tasks are defined here, at module level, so the in-process engine imports them."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from tests.testapp.models import ActivityCall
from weft_django.tasks._compat import (
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
    task_finished,
)

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


def _count(name: str, key: str = "") -> int:
    ActivityCall.objects.create(name=name, key=key)
    return ActivityCall.objects.filter(name=name, key=key).count()


@task(takes_context=True)
def probe(context: Any, key: str) -> dict[str, Any]:
    """Fails its first attempt; on the second, reads its own TaskResult through get_result (what any
    other process sees while this attempt runs) and returns what it saw."""
    calls = _count("tasks_faults.probe", key)
    if calls == 1:
        raise ConnectionError("first attempt fails")
    seen = task_backends["default"].get_result(context.task_result.id)
    return {
        "status": str(seen.status),
        "attempts": seen.attempts,
        "errors": [e.exception_class_path for e in seen.errors],
        "started_at": seen.started_at.isoformat(),
        "last_attempted_at": seen.last_attempted_at.isoformat(),
    }


@task
def flaky_once(key: str) -> str:
    if _count("tasks_faults.flaky_once", key) == 1:
        raise ConnectionError(f"attempt 1 of {key} failed")
    return "ok"


@task(backend="once")
def returns_nan(key: str) -> float:
    _count("tasks_faults.returns_nan", key)
    return float("nan")


@task
def returns_big(key: str) -> str:
    _count("tasks_faults.returns_big", key)
    return "x" * 5000


@task(backend="once")
def slow(key: str) -> str:
    _count("tasks_faults.slow", key)
    time.sleep(1.5)
    return "done"


def _finished_signals() -> tuple[list[tuple[str, str]], Any]:
    seen: list[tuple[str, str]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append((task_result.id, str(task_result.status)))

    task_finished.connect(receiver, weak=False)
    return seen, receiver


# -- 1. errors / last_attempted_at while a task is retried -------------------------------------------


def test_while_retried_the_error_of_the_failed_attempt_is_visible(weft_run_until_idle) -> None:
    result = probe.enqueue("p1")
    weft_run_until_idle()
    result.refresh()
    seen = result.return_value
    assert seen["status"] == "RUNNING" and seen["attempts"] == 2
    # attempt 1 raised ConnectionError: a get_result() during attempt 2 should report it
    assert seen["errors"] == ["builtins.ConnectionError"]


def test_while_retried_last_attempted_at_is_the_current_attempt(weft_run_until_idle) -> None:
    result = probe.enqueue("p2")
    weft_run_until_idle()
    result.refresh()
    seen = result.return_value
    assert seen["attempts"] == 2
    # during attempt 2 the task was last attempted when attempt 2 began, after attempt 1 began
    assert dt.datetime.fromisoformat(seen["last_attempted_at"]) > dt.datetime.fromisoformat(seen["started_at"])


def test_a_task_that_succeeded_after_a_retry_keeps_the_error_of_the_failed_attempt(weft_run_until_idle) -> None:
    result = flaky_once.enqueue("f1")
    weft_run_until_idle()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 2
    # docs/tasks.md: errors is "the recorded error: weft keeps the last error of the activity"
    assert [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"]


# -- 2. task_finished(SUCCESSFUL) sent for an attempt that then fails -------------------------------


def test_a_return_value_weft_cannot_store_is_not_reported_successful(weft_run_until_idle) -> None:
    seen, receiver = _finished_signals()
    try:
        result = returns_nan.enqueue("n1")
        weft_run_until_idle()
    finally:
        task_finished.disconnect(receiver)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED  # the codec refuses NaN: the attempt failed
    assert seen == [(result.id, "FAILED")]


def test_an_oversized_return_value_does_not_rerun_a_task_that_succeeded(weft_run_until_idle) -> None:
    seen, receiver = _finished_signals()
    try:
        with override_settings(WEFT={**settings.WEFT, "PAYLOAD_MAX_BYTES": 2000}):
            result = returns_big.enqueue("b1")
            weft_run_until_idle()
    finally:
        task_finished.disconnect(receiver)
    result.refresh()
    calls = ActivityCall.objects.filter(name="tasks_faults.returns_big").count()
    statuses = [status for _, status in seen]
    assert (result.status, calls, statuses) == (TaskResultStatus.FAILED, 1, ["FAILED"])


def test_an_attempt_past_its_timeout_is_not_reported_successful(weft_run_until_idle) -> None:
    tasks_setting = {
        **settings.TASKS,
        "short": {
            "BACKEND": "weft_django.tasks.WeftBackend",
            "OPTIONS": {"RETRY": {"max_attempts": 1}, "TIMEOUT": "300ms"},
        },
    }
    seen, receiver = _finished_signals()
    try:
        with override_settings(TASKS=tasks_setting):
            result = slow.using(backend="short").enqueue("t1")
            weft_run_until_idle()
            time.sleep(2.5)  # the attempt's thread runs on past its timeout
            result.refresh()
    finally:
        task_finished.disconnect(receiver)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["weft_django.exceptions.ActivityTimeoutError"]
    assert seen == [(result.id, "FAILED")] or seen == []  # never SUCCESSFUL for a task that FAILED


# -- 3. inputs --------------------------------------------------------------------------------------


def test_with_use_tz_false_enqueue_says_weft_needs_use_tz() -> None:
    """django_tasks' validate_task accepts a naive run_after when USE_TZ = False, but weft stores aware
    times (every run's created_at too: on SQLite no run can be stored with USE_TZ = False). enqueue()
    raised weft's "start_at must be timezone-aware" (a ValueError about an argument the caller gave
    correctly); it now refuses with InvalidTaskBackend saying weft needs USE_TZ = True, stores nothing,
    and the backend's check reports weft.tasks.E002."""
    from tests.testapp import tasks
    from weft_django.models import Workflow
    from weft_django.tasks._compat import InvalidTaskBackend

    with override_settings(USE_TZ=False):
        when = dt.datetime.now() + dt.timedelta(hours=1)
        deferred = tasks.add.using(run_after=when)  # validate_task accepts it
        with pytest.raises(InvalidTaskBackend, match="USE_TZ = True"):
            deferred.enqueue(1, 1)
        with pytest.raises(InvalidTaskBackend, match="USE_TZ = True"):
            tasks.add.enqueue(1, 1)
        assert [m.id for m in task_backends["default"].check()] == ["weft.tasks.E002"]
    assert not Workflow.objects.exists()


def test_a_nan_argument_raises_a_type_or_value_error_as_documented() -> None:
    """docs/tasks.md: enqueue raises TypeError for an argument that is not JSON; the docstring says
    TypeError / ValueError."""
    from tests.testapp import tasks
    from weft_django.models import Workflow

    with pytest.raises((TypeError, ValueError)):
        tasks.add.enqueue(float("nan"), 1)
    assert not Workflow.objects.exists()


@pytest.mark.postgres
def test_get_result_of_an_id_with_a_nul_is_task_result_does_not_exist() -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("abc\x00def")


# -- 4. a WeftBackend subclass: engines do not register the task workflow -----------------------------


def test_engines_of_a_project_using_a_weft_backend_subclass_know_the_task_workflow(tmp_path: Path) -> None:
    (tmp_path / "sub_backend.py").write_text(
        "from weft_django.tasks import WeftBackend\n\n\nclass MyBackend(WeftBackend):\n    pass\n"
    )
    (tmp_path / "sub_settings.py").write_text(
        'from tests.settings import *  # noqa\nTASKS = {"default": {"BACKEND": "sub_backend.MyBackend"}}\n'
    )
    code = (
        "import django; django.setup()\n"
        "from weft_django.registry import registry\n"
        "print('weft_django.tasks.run' in registry.latest)\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "DJANGO_SETTINGS_MODULE": "sub_settings",
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # an engine started with this project must know the workflow every enqueue() starts
    assert out.stdout.strip() == "True"


# -- 5. a task that raises SystemExit ----------------------------------------------------------------


@task(backend="once")
def exits(key: str) -> None:
    _count("tasks_faults.exits", key)
    raise SystemExit(3)


def test_a_task_that_raises_system_exit_fails() -> None:
    """django.tasks' own backends record any BaseException but KeyboardInterrupt as the task's error
    (FAILED); weft's activity runner caught only Exception, so the attempt never reported an outcome
    and the engine never went idle (run_until_idle timed out, the task stayed RUNNING)."""
    from weft_django.testing import run_until_idle

    result = exits.enqueue("e1")
    run_until_idle(timeout=15)
    result.refresh()
    assert ActivityCall.objects.filter(name="tasks_faults.exits").count() == 1
    assert result.status == TaskResultStatus.FAILED, (result.status, result.attempts)
    assert [e.exception_class_path for e in result.errors] == ["builtins.SystemExit"]


# -- 6. concurrency: the same task enqueued from many threads (expected to pass: a probe) -------------


def test_the_same_task_enqueued_from_many_threads(weft_run_until_idle) -> None:
    from django.db import connections

    from tests.testapp import tasks

    ids: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        try:
            for i in range(5):
                result = tasks.add.enqueue(n, i)
                with lock:
                    ids.append(result.id)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(set(ids)) == 40
    weft_run_until_idle()
    statuses = {tasks.add.get_result(i).status for i in ids}
    assert statuses == {TaskResultStatus.SUCCESSFUL}


# -- 7. the engine crashes mid-task ------------------------------------------------------------------


@task(backend="once")
def slow_once(key: str) -> int:
    calls = _count("tasks_faults.slow_once", key)
    time.sleep(4)
    return calls


@pytest.mark.subprocess
def test_after_the_engine_running_a_task_dies_the_task_is_not_running(weft_engines) -> None:
    """A task whose engine was killed mid-attempt reported RUNNING until another engine took it over.
    Once its claim has lapsed (store/claims/lapse.py's rule: here expired at once) nobody runs it: it is
    READY (to run again). The attempt lost with its engine runs again under the same attempt number
    (at least once, docs/tasks.md): the function ran twice, TaskResult.attempts says 1."""
    from weft_django.testing import expire_claims, wait_for

    result = slow_once.enqueue("c1")
    engine = weft_engines("faults-a")
    wait_for(lambda: ActivityCall.objects.filter(name="tasks_faults.slow_once").count() == 1, 60)
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    engine.kill()
    engine.wait()
    expire_claims("faults-a")  # the claim lapses (a dead engine's would once its TTL passed)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    other = weft_engines("faults-b")
    try:
        wait_for(lambda: slow_once.get_result(result.id).is_finished, 60)
    finally:
        other.stop()
    result.refresh()
    calls = ActivityCall.objects.filter(name="tasks_faults.slow_once").count()
    assert (result.status, result.return_value, result.attempts, calls) == (TaskResultStatus.SUCCESSFUL, 2, 1, 2)


# -- 8. a task run row not written by enqueue() -------------------------------------------------------


@pytest.mark.parametrize("request_arg", [{"task": "tests.testapp.tasks.add"}, "not a dict"])
def test_get_result_of_a_task_run_not_written_by_enqueue_is_task_result_does_not_exist(request_arg: Any) -> None:
    """results.TaskNotFoundError's docstring: 'a row not written by enqueue' is TaskResultDoesNotExist."""
    import weft_django as weft
    from weft_django.tasks import WORKFLOW_NAME

    handle = weft.start(WORKFLOW_NAME, args=[request_arg])
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(handle.id)
