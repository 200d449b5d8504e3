"""The drain at shutdown waits for the attempts whose results it can still commit, not for attempts the
engine already gave up on (timed out, or of a workflow that ended): their outcomes are dropped whatever
they return, so waiting for them only held every claim of the engine for the whole drain timeout
(found by a helper's review, rev15)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import weft_django as weft
from weft_django.engine.engine import Engine

pytestmark = pytest.mark.django_db(transaction=True)
RELEASE = threading.Event()
STARTED = threading.Event()


@weft.activity(name="tests.rv15_hangs", timeout="300ms")
def hangs() -> str:
    """Hangs (a call without a client-side timeout) until the test lets it go."""
    STARTED.set()
    RELEASE.wait(60)
    return "late"


@weft.workflow(name="tests.rv15_gives_up")
def gives_up(ctx: Any) -> Any:
    try:
        return (yield ctx.run(hangs))
    except weft.ActivityError as exc:
        return exc.type


def test_the_drain_does_not_wait_for_an_attempt_that_timed_out() -> None:
    RELEASE.clear()
    STARTED.clear()
    handle = weft.start(gives_up, id="rv15-drain")
    engine = Engine("rv15-drain", concurrency=2, drain_timeout=20)
    loop = threading.Thread(target=engine.run, name="rv15-engine")
    loop.start()
    try:
        assert handle.result(timeout=30) == "ActivityTimeoutError"
        assert engine.executor.running, "the abandoned attempt still holds its thread"
        began = time.monotonic()
        engine.request_stop()
        loop.join(30)
        took = time.monotonic() - began
    finally:
        RELEASE.set()
        engine.request_stop()
        loop.join(30)
    assert not loop.is_alive()
    assert took < 5, f"the drain waited {took:.1f} s for an attempt whose result it would drop"
