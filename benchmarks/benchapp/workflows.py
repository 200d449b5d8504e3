"""The benchmark workloads. Activities do nothing, so what is measured is the engine and the database."""

from __future__ import annotations

import weft_django as weft


@weft.activity(name="bench.noop")
def noop(i: int) -> int:
    return i


@weft.workflow(name="bench.three_noop")
def three_noop(ctx: weft.WorkflowContext, n: int):  # type: ignore[no-untyped-def]
    a = yield ctx.run(noop, n)
    b = yield ctx.run(noop, a + 1)
    c = yield ctx.run(noop, b + 1)
    return c


@weft.workflow(name="bench.parked")
def parked(ctx: weft.WorkflowContext, n: int):  # type: ignore[no-untyped-def]
    """Parks until signal "go" (the takeover scenario: its engine holds the claim while it waits)."""
    payload = yield ctx.wait_for_signal("go")
    return [n, payload]


@weft.workflow(name="bench.sleeper")
def sleeper(ctx: weft.WorkflowContext, n: int, seconds: int):  # type: ignore[no-untyped-def]
    """Sleeps ``seconds`` on a durable timer (the parked and timers scenarios of benchmarks/scale.py)."""
    yield ctx.sleep(seconds)
    return n


@weft.activity(name="bench.noop_local", local=True)
def noop_local(i: int) -> int:
    return i


@weft.workflow(name="bench.three_local")
def three_local(ctx: weft.WorkflowContext, n: int):  # type: ignore[no-untyped-def]
    """bench.three_noop with local activities (``local=True``): one commit for the three steps and the end."""
    a = yield ctx.run(noop_local, n)
    b = yield ctx.run(noop_local, a + 1)
    c = yield ctx.run(noop_local, b + 1)
    return c
