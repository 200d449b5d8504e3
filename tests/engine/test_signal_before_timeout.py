"""A signal buffered before a timed wait begins is that wait's outcome, whatever its timeout: "a signal
sent before the workflow waits is consumed when it gets there" (the reference). The engine fired the
due timers of a pass before it looked at the mailboxes, so a wait with a timeout shorter than a pass
(or 0, the idiom for "take it if it is there") timed out with its signal already buffered (found by a
helper's review, rev12)."""

from __future__ import annotations

from typing import Any

import pytest

import weft_django as weft
from weft_django.models import BufferedSignal, Step, Timer, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.rev12_buffered_before_wait")
def buffered_before_wait(ctx: Any, timeout: Any) -> Any:
    yield ctx.wait_for_signal("ready")
    try:
        first = yield ctx.wait_for_signal("go", timeout=timeout)
    except weft.WaitTimeoutError:
        first = "timed out"
    try:
        second = yield ctx.wait_for_signal("go", timeout=timeout)  # nothing buffered now: it times out
    except weft.WaitTimeoutError:
        second = "timed out"
    return [first, second]


@pytest.mark.parametrize("timeout", [0, "1ms"])
def test_a_signal_buffered_before_a_short_timed_wait_is_its_outcome(weft_run_until_idle, timeout):
    handle = weft.start(buffered_before_wait, args=[timeout], id=f"rev12-before-wait-{timeout}")
    handle.signal("go", "payload")  # buffered before the wait for it begins
    handle.signal("ready", 1)
    weft_run_until_idle()
    row = Workflow.objects.get(pk=handle.id)
    assert (row.status, handle.result(timeout=1)) == ("completed", ["payload", "timed out"])
    steps = dict(Step.objects.filter(run_id=row.run_id, kind="signal").values_list("seq", "status"))
    assert steps == {0: "completed", 1: "completed", 2: "failed"}
    assert not Timer.objects.filter(workflow_id=handle.id).exists()
    consumed = BufferedSignal.objects.filter(workflow_id=handle.id).values_list("name", "consumed_seq")
    assert set(consumed) == {("ready", 0), ("go", 1)}
