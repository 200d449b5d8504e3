"""A ``wait_until`` predicate is evaluated again when its timeout fires (the reference: "re-evaluated
when an update handler changes state or the timeout fires; returns true/false with a timeout"). The
engine recorded False at the timeout without asking the predicate, so one that had come to hold by
then (it reads state no update handler changed) still returned False (found by a helper's review,
rev12). Whatever it answers is recorded: replay reads the step, not the predicate."""

from __future__ import annotations

from typing import Any

import pytest

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import Step, Workflow

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)

FLAGS: dict[str, Any] = {}


@weft.workflow(name="tests.rev12_wait_until_at_timeout")
def wait_until_at_timeout(ctx: Any, key: str) -> Any:
    def ready() -> bool:
        value = FLAGS.get(key)
        if isinstance(value, Exception):
            raise value
        return bool(value)

    return (yield ctx.wait_until(ready, timeout="1h"))


@pytest.mark.parametrize(("flag", "expected"), [(True, True), (False, False), (RuntimeError("boom"), False)])
def test_the_predicate_is_asked_again_when_the_timeout_fires(weft_clock, flag, expected):
    key = f"rev12-wait-until-{type(flag).__name__}-{flag}"
    FLAGS[key] = False
    handle = weft.start(wait_until_at_timeout, args=[key], id=key)
    engine = Engine("rev12-wait-until")  # one engine throughout: a reload would ask the predicate anew
    engine.start()
    try:
        tick_until(engine, lambda: bool(engine.owned.get(key) and engine.owned[key].timers), "the run parked")
        FLAGS[key] = flag  # comes to hold (or not, or raises) while the run waits
        weft_clock.advance(2 * 3600)
        tick_until(engine, lambda: handle.status == "completed", "the timeout")
    finally:
        engine.shutdown()
    assert (handle.status, handle.result(timeout=1)) == ("completed", expected)
    step = Step.objects.get(run_id=Workflow.objects.get(pk=key).run_id, kind="wait_until")
    assert step.result == ("true" if expected else "false")
