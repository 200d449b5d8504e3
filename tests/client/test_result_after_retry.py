"""result() and the outcome an R: wake-up carries (store/notify.py, waits.py), across retry():
a retried run keeps its run_id, so the wake-up of the failure it was retried from names the very run
a waiter started after the retry sees running (a helper's review)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from django.db import connection

import weft_django as weft
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.store import notify
from weft_django.waits import ResultTimeoutError

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
_calls = {"n": 0}


@weft.activity(name="tests.rar_fails_first", local=True)
def rar_fails_first() -> str:
    _calls["n"] += 1
    if _calls["n"] == 1:
        raise ValueError("first attempt fails")
    return "ok"


@weft.workflow(name="tests.rar_flaky")
def rar_flaky(ctx: Any) -> Any:
    return (yield ctx.run(rar_fails_first))


@weft.workflow(name="tests.rar_parked")
def rar_parked(ctx: Any) -> Any:
    return (yield ctx.wait_for_signal("go"))


def test_a_waiter_after_retry_does_not_get_the_failure_announced_before_it() -> None:
    engine = Engine("rar", concurrency=2)
    engine.start()
    try:
        # A waiter that keeps this process's LISTEN connection open for the whole test.
        parked = weft.start(rar_parked, id="rar-parked")
        keeper = threading.Thread(target=lambda: _ignore(parked.result, 20), daemon=True)
        keeper.start()
        handle = weft.start(rar_flaky, id="rar-flaky")
        # Wake-ups queued ahead of the failure's, so the listener hears of the failure late (as a busy
        # process would), after the retry below and after the next waiter's first read.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify('weft', 'x:' || g) FROM generate_series(1, 300000) AS g")
        tick_until(engine, lambda: handle.describe()["status"] == "failed", "the first failure")
        handle.retry()
        assert handle.describe()["status"] == "running"
        # The engine is not ticked: the retried run stays running, so result() must time out.
        with pytest.raises(ResultTimeoutError):
            handle.result(timeout=4)
    finally:
        engine.shutdown()


def _ignore(wait: Any, seconds: float) -> None:
    with contextlib.suppress(Exception):  # it only keeps the listener open
        wait(timeout=seconds)


def test_a_failure_is_announced_without_its_outcome() -> None:
    assert notify.ended_payload("wf-1", "failed", None, {"type": "E"}, "r") == "r:wf-1"
    assert notify.parse_ended('["wf-1", "failed", null, {"type": "E"}, "r"]') is None
