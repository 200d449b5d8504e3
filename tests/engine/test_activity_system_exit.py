"""An activity that raises SystemExit (or a KeyboardInterrupt that cannot be Ctrl+C) is a failed attempt.

The thread executor's attempt runner caught only Exception: a SystemExit from an activity body went up
to the worker thread, which logged it and reported no outcome, so the engine waited for the attempt
for ever (the run stayed running, ``run_until_idle`` never went idle). Now it is the attempt's failure,
retried by the activity's policy like any exception, as Django's own task backends treat it.
"""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import Step, Workflow
from weft_django.status import WorkflowStatus
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


@weft.activity(name="tests.system_exit.exits", retry=weft.RetryPolicy(max_attempts=2, initial_backoff="10ms"))
def exits(tag: str) -> None:
    ActivityCall.objects.create(name="tests.system_exit.exits", key=tag)
    raise SystemExit(3)


@weft.activity(name="tests.system_exit.atomic", atomic=True, retry=weft.RetryPolicy(max_attempts=1))
def exits_atomically(tag: str) -> None:
    ActivityCall.objects.create(name="tests.system_exit.atomic", key=tag)
    raise SystemExit(4)


@weft.workflow(name="tests.system_exit.plain")
def plain(ctx: weft.WorkflowContext, tag: str):
    yield ctx.run(exits, tag)
    return "unreachable"


@weft.workflow(name="tests.system_exit.atomic")
def atomic(ctx: weft.WorkflowContext, tag: str):
    yield ctx.run(exits_atomically, tag)
    return "unreachable"


def test_an_activity_raising_system_exit_is_retried_then_fails_its_run() -> None:
    handle = weft.start(plain, args=["a"], id="system-exit-plain")
    run_until_idle(timeout=15)
    row = Workflow.objects.get(pk=handle.id)
    step = Step.objects.get(workflow_id=handle.id, seq=0)
    assert row.status == WorkflowStatus.FAILED
    assert (step.status, step.attempts, step.error["type"]) == ("failed", 2, "SystemExit")
    assert ActivityCall.objects.filter(name="tests.system_exit.exits").count() == 2


def test_an_atomic_activity_raising_system_exit_rolls_back_and_fails_its_run() -> None:
    handle = weft.start(atomic, args=["b"], id="system-exit-atomic")
    run_until_idle(timeout=15)
    assert Workflow.objects.get(pk=handle.id).status == WorkflowStatus.FAILED
    assert Step.objects.get(workflow_id=handle.id, seq=0).error["type"] == "SystemExit"
    assert not ActivityCall.objects.filter(name="tests.system_exit.atomic").exists()  # rolled back


@weft.activity(name="tests.system_exit.interrupts", retry=weft.RetryPolicy(max_attempts=1))
def interrupts() -> None:
    raise KeyboardInterrupt


@weft.activity(name="tests.system_exit.local_interrupts", local=True, retry=weft.RetryPolicy(max_attempts=1))
def local_interrupts() -> None:
    raise KeyboardInterrupt


@weft.workflow(name="tests.system_exit.uses_interrupts")
def uses_interrupts(ctx: weft.WorkflowContext, local: bool):
    yield ctx.run(local_interrupts if local else interrupts)
    return "unreachable"


def test_a_keyboard_interrupt_raised_on_an_activity_thread_fails_its_attempt() -> None:
    """Signals go to the main thread: on an executor thread a KeyboardInterrupt is user code's, and
    propagating it left the run waiting for an outcome for ever (as SystemExit did)."""
    handle = weft.start(uses_interrupts, args=[False], id="interrupt-thread")
    run_until_idle(timeout=15)
    assert Workflow.objects.get(pk=handle.id).status == WorkflowStatus.FAILED
    assert Step.objects.get(workflow_id=handle.id, seq=0).error["type"] == "KeyboardInterrupt"


def test_a_local_activitys_keyboard_interrupt_in_an_engine_fails_its_attempt(monkeypatch) -> None:
    """weft_engine installs its own SIGINT handler, so a KeyboardInterrupt on its loop is user code's:
    a local activity raising one took the engine loop down, and every engine that claimed the run next
    (its step is recorded only after it runs). Ctrl+C under Python's own handler still propagates."""
    import signal

    from weft_django.activity_runtime import propagates

    assert propagates(KeyboardInterrupt()) is (signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    monkeypatch.setattr(signal, "getsignal", lambda signum: lambda *args: None)  # as in weft_engine
    handle = weft.start(uses_interrupts, args=[True], id="interrupt-local")
    run_until_idle(timeout=15)
    assert Workflow.objects.get(pk=handle.id).status == WorkflowStatus.FAILED


def test_a_celery_workers_own_shutdown_is_not_the_attempts_failure() -> None:
    """Celery's WorkerTerminate / WorkerShutdown (SystemExit subclasses raised into a running task at a
    hard shutdown) end the worker; swallowed as the activity's failure they delayed the shutdown."""
    pytest.importorskip("celery")
    from celery.exceptions import WorkerShutdown, WorkerTerminate

    from weft_django.activity_runtime import propagates

    assert propagates(WorkerTerminate(1), worker=True) and propagates(WorkerShutdown(0), worker=True)
    assert not propagates(WorkerShutdown(0))  # on an engine: user code's (see below)
    assert not propagates(SystemExit(3)) and not propagates(ValueError())


@weft.activity(name="tests.system_exit.framework", retry=weft.RetryPolicy(max_attempts=1))
def raises_a_frameworks_exception(local: bool) -> None:
    from celery.exceptions import WorkerShutdown

    raise WorkerShutdown(0)  # as gevent.Timeout or GreenletExit would, from user code on an engine


@weft.workflow(name="tests.system_exit.uses_framework")
def uses_framework(ctx: weft.WorkflowContext, local: bool):
    yield ctx.run(raises_a_frameworks_exception.options(local=True) if local else raises_a_frameworks_exception, local)
    return "unreachable"


@pytest.mark.parametrize("local", [False, True], ids=["thread", "local"])
def test_a_frameworks_exception_in_an_engine_fails_its_attempt(local: bool) -> None:
    """An engine is no Celery (or gevent) worker: such an exception on its threads or its loop is user
    code's. Propagated, it ended the activity thread with no outcome (the run waited for ever) or the
    engine loop. Only a Celery worker running the attempt lets it through (the worker's own shutdown)."""
    pytest.importorskip("celery")
    handle = weft.start(uses_framework, args=[local], id=f"framework-{local}")
    run_until_idle(timeout=15)
    assert Workflow.objects.get(pk=handle.id).status == WorkflowStatus.FAILED
    assert Step.objects.get(workflow_id=handle.id, seq=0).error["type"] == "WorkerShutdown"
