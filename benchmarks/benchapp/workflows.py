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


# -- one big workflow (benchmarks/workflow_scale.py) ---------------------------------------------------
@weft.workflow(name="bench.memos")
def memos(ctx: weft.WorkflowContext, n: int):  # type: ignore[no-untyped-def]
    """A history of ``n`` memo steps, each recorded by the engine itself (no activity)."""
    total = 0
    for i in range(n):
        total += yield ctx.memo(f"k{i}", lambda: 1)
    return total


@weft.workflow(name="bench.fan_out_local")
def fan_out_local(ctx: weft.WorkflowContext, n: int):  # type: ignore[no-untyped-def]
    """One ctx.all of ``n`` local activities."""
    values = yield ctx.all([ctx.run(noop_local, i) for i in range(n)])
    return sum(values)


@weft.workflow(name="bench.fan_out")
def fan_out(ctx: weft.WorkflowContext, n: int):  # type: ignore[no-untyped-def]
    """One ctx.all of ``n`` activities on the engine's threads."""
    values = yield ctx.all([ctx.run(noop, i) for i in range(n)])
    return sum(values)


@weft.workflow(name="bench.signal_sum")
def signal_sum(ctx: weft.WorkflowContext, n: int):  # type: ignore[no-untyped-def]
    """Waits for ``n`` signals "add", one wait at a time (they are all buffered before it runs)."""
    total = 0
    for _ in range(n):
        total += yield ctx.wait_for_signal("add")
    return total


@weft.workflow(name="bench.leaf")
def leaf(ctx: weft.WorkflowContext, i: int):  # type: ignore[no-untyped-def]
    """A child that returns at once."""
    return i
    yield  # a generator: a workflow


@weft.workflow(name="bench.children")
def children(ctx: weft.WorkflowContext, n: int):  # type: ignore[no-untyped-def]
    """One ctx.all of ``n`` child workflows."""
    values = yield ctx.all([ctx.start_child(leaf, args=[i]) for i in range(n)])
    return sum(values)
