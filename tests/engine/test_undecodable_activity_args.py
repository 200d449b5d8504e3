"""An activity attempt whose arguments cannot be decoded reports a failed attempt; it used to report
nothing on the engine's threads (the decode raised before the attempt's own error handling, the thread
logged it and went on), so its workflow waited for an outcome that never came: for ever without a
timeout (a helper's review, rev15).

The codec encodes a datetime in a ZoneInfo made with ``ZoneInfo.from_file(..., key=...)`` under a key
no time zone database has, and refuses it when decoding: such arguments reach the attempt."""

from __future__ import annotations

import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import weft_django as weft
from weft_django.engine.engine import Engine

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)
CALLS: list[str] = []


def _unloadable_zone() -> ZoneInfo:
    with open("/usr/share/zoneinfo/Europe/Paris", "rb") as source:
        return ZoneInfo.from_file(source, key="Nowhere/Land")


@weft.activity(name="tests.rv15_takes_a_time")
def takes_a_time(when: Any) -> str:
    CALLS.append("plain")
    return str(when)


@weft.activity(name="tests.rv15_takes_a_time_atomic", atomic=True)
def takes_a_time_atomic(when: Any) -> str:
    CALLS.append("atomic")
    return str(when)


@weft.activity(name="tests.rv15_takes_a_time_local", local=True)
def takes_a_time_local(when: Any) -> str:
    CALLS.append("local")
    return str(when)


ACTIVITIES = {"plain": takes_a_time, "atomic": takes_a_time_atomic, "local": takes_a_time_local}


@weft.workflow(name="tests.rv15_undecodable_args")
def undecodable_args(ctx: Any, kind: str) -> Any:
    when = datetime.datetime(2024, 1, 1, tzinfo=_unloadable_zone())
    try:
        return (yield ctx.run(ACTIVITIES[kind], when))
    except weft.ActivityError as exc:
        return [exc.type, exc.attempts]


@pytest.mark.parametrize("kind", ["plain", "atomic", "local"])
def test_undecodable_arguments_fail_the_attempt(kind: str) -> None:
    CALLS.clear()
    handle = weft.start(undecodable_args, args=[kind], id=f"rv15-args-{kind}")
    engine = Engine(f"rv15-args-{kind}", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: handle.describe()["status"] != "running", "the run's end", timeout=10)
    finally:
        engine.shutdown()
    assert handle.describe()["status"] == "completed"
    assert handle.result(timeout=5) == ["CorruptPayloadError", 1]
    assert CALLS == []
