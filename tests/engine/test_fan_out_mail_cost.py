"""A fan-out of waits for buffered records (a ctx.all of children, or of signals of different names)
takes each record in work that does not grow with the fan-out: consuming one does not walk the
other branches.

Before the fix, each record consumed looked for its wait among the workflow's waiting leaves in
frontier order (each child's end, or each signal name, is its own mailbox: the i-th one walked i
leaves), then rebuilt that list without it: n * n / 2 leaves or more for a fan-out of n, on the
engine loop's thread. A parent starting 8,000 children took 52.5 s to complete (8.9 s of it in that
rebuild alone); see the commit for the figures after. The work is counted here, not timed: the lines
of engine/signal_delivery.py the loop's thread runs (a trace), as in test_signal_backlog_cost.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.engine.engine import Engine

from .test_signal_backlog_cost import delivery_lines
from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)

FAN_OUT = 400


@weft.workflow(name="tests.fan_out_mail_leaf")
def leaf(ctx: Any, i: int) -> Any:
    return i
    yield  # a generator: a workflow


@weft.workflow(name="tests.fan_out_mail_children")
def children(ctx: Any, n: int) -> Any:
    values = yield ctx.all([ctx.start_child(leaf, args=[i]) for i in range(n)])
    return sum(values)


@weft.workflow(name="tests.fan_out_mail_signals")
def signals(ctx: Any, n: int) -> Any:
    values = yield ctx.all([ctx.wait_for_signal(f"s{i}", timeout="1h") for i in range(n)])
    return sum(values)


@pytest.mark.postgres
@override_settings(WEFT={"POLL_INTERVAL": "60s"})
def test_the_ends_of_many_children_are_taken_in_work_that_does_not_grow_with_them() -> None:
    handle = weft.start(children, args=[FAN_OUT], id="fan-out-children")
    engine = Engine("fan-out-children", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned, "the parent held")
        lines = delivery_lines(engine, handle.id)
        assert handle.result(timeout=5) == FAN_OUT * (FAN_OUT - 1) // 2
        per_child = lines / FAN_OUT
        message = f"{lines:,} lines of signal delivery for {FAN_OUT} children's ends ({per_child:.0f} each)"
        assert per_child < 100, message
    finally:
        engine.shutdown()


@pytest.mark.postgres
@override_settings(WEFT={"POLL_INTERVAL": "60s"})
def test_many_signals_of_a_fan_out_are_taken_in_work_that_does_not_grow_with_it() -> None:
    handle = weft.start(signals, args=[FAN_OUT], id="fan-out-signals")
    engine = Engine("fan-out-signals", concurrency=2)
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned, "the workflow held")
        for _ in range(3):  # it waits for its signals, its mailbox known
            engine.tick()
        for i in range(FAN_OUT):
            handle.signal(f"s{i}", i)
        lines = delivery_lines(engine, handle.id)
        assert handle.result(timeout=5) == FAN_OUT * (FAN_OUT - 1) // 2
        per_signal = lines / FAN_OUT
        message = f"{lines:,} lines of signal delivery for {FAN_OUT} signals of a fan-out ({per_signal:.0f} each)"
        assert per_signal < 100, message
    finally:
        engine.shutdown()
