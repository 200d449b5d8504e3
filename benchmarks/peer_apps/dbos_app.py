"""DBOS peer workflows: the same shapes as bench.three_noop and bench.parked (benchmarks/benchapp)."""

from __future__ import annotations

from dbos import DBOS


@DBOS.step()
def noop(i: int) -> int:
    return i


@DBOS.workflow()
def three_noop(n: int) -> int:
    a = noop(n)
    b = noop(a + 1)
    return noop(b + 1)


@DBOS.workflow()
def parked(n: int) -> list:
    """Parks in DBOS.recv("go"); the event "parked" tells the driver it got there."""
    DBOS.set_event("parked", True)
    payload = DBOS.recv("go", timeout_seconds=120)
    return [n, payload]
