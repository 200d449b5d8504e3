"""An activity that raises SystemExit (any BaseException but KeyboardInterrupt) is a failed attempt.

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
