"""ctx.log (weft_django/context.py): a logger whose lines name the workflow, silent while a run replays
its recorded steps. The code after the last recorded step runs live again after a reload (nothing
durable says it ran): its lines are at least once (docs/concepts.md)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import weft_django as weft
from weft_django.models import Workflow
from weft_django.testing import running_engine, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@weft.activity(local=True)
def ctx_log_step(n: int) -> int:
    return n + 1


@weft.workflow(name="tests.ctx_log")
def logs_around_a_signal(ctx: Any, n: int) -> Any:
    ctx.log.info("before the step n=%s", n)
    got = yield ctx.run(ctx_log_step, n)
    ctx.log.info("after the step got=%s", got)
    payload = yield ctx.wait_for_signal("go")
    ctx.log.info("after the signal payload=%s", payload)
    return [got, payload]


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "weft_django.workflow" and text in r.getMessage()]


def test_ctx_log_is_silent_on_recorded_steps_and_at_least_once_after_them(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="weft_django.workflow")
    handle = weft.start(logs_around_a_signal, args=[7], id="ctx-log")
    with running_engine("ctx-log-first"):
        wait_for(lambda: _lines(caplog, "after the step"), timeout=30, message="the first engine ran the code")
    # The first engine released its claim at its drain: the next one loads the run and replays it.
    handle.signal("go", "now")
    with running_engine("ctx-log-second"):
        wait_for(
            lambda: Workflow.objects.filter(id="ctx-log", status="completed").exists(),
            timeout=30,
            message="the second engine ends the run",
        )
    assert handle.result(timeout=10) == [8, "now"]
    assert _lines(caplog, "before the step") == ["[ctx-log] before the step n=7"], "replaying a recorded step logged"
    # Run by each engine: nothing durable said the first had run it.
    assert _lines(caplog, "after the step") == ["[ctx-log] after the step got=8"] * 2
    assert _lines(caplog, "after the signal") == ["[ctx-log] after the signal payload=now"]
