"""An activity attempt whose arguments cannot be decoded reports a failed attempt; it used to report
nothing on the engine's threads (the decode raised before the attempt's own error handling, the thread
logged it and went on), so its workflow waited for an outcome that never came: for ever without a
timeout (a helper's review, rev15).

Such arguments came from a codec asymmetry (a ZoneInfo.from_file zone under an unknown key was encoded
with its key and refused when decoded; now normalised, tests/client/test_codec.py); the attempt's own
handling stays for any text its decode refuses, injected here at the executor's decode."""

from __future__ import annotations

from typing import Any

import pytest

import weft_django as weft
from weft_django.codec import CorruptPayloadError, decode
from weft_django.engine.engine import Engine

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)
CALLS: list[str] = []


UNREADABLE = "rv15-unreadable-argument"


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
    when = UNREADABLE  # the executor's decode refuses the text that holds it (the test's fault)
    try:
        return (yield ctx.run(ACTIVITIES[kind], when))
    except weft.ActivityError as exc:
        return [exc.type, exc.attempts]


@pytest.mark.parametrize("kind", ["plain", "atomic", "local"])
def test_undecodable_arguments_fail_the_attempt(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from weft_django.engine import activities

    def refusing(text: Any) -> Any:
        if isinstance(text, str) and UNREADABLE in text:
            raise CorruptPayloadError("time zone 'Nowhere/Land' is not known here")
        return decode(text)

    monkeypatch.setattr(activities, "decode", refusing)
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
