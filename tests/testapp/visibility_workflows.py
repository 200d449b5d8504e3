"""Workflows of the visibility tests (issue 19): search attributes, fork, bulk operations. Imported by
tests/testapp/workflows.py so engine subprocesses register them too."""

from __future__ import annotations

from datetime import datetime

import weft_django as weft

ORDER_ATTRIBUTES = {
    "customer": str,
    "amount": float,
    "items": int,
    "vip": bool,
    "placed_at": datetime,
    "tags": list[str],
    "stage": str,
}
# What the fork tests' activity returns, by key: a test edits it to play "the bug fix".
FORK_VERSION = {"value": "v1"}


@weft.activity(name="visibility.step")
def step(label: str) -> str:
    return f"{label}:{FORK_VERSION['value']}"


@weft.workflow(name="visibility.order", attributes=ORDER_ATTRIBUTES)
def order(ctx, customer: str, amount: float, tags: list[str] | None = None):
    ctx.set_attributes(customer=customer, amount=amount, stage="placed")
    if tags is not None:
        ctx.set_attributes(tags=tags)
    first = yield ctx.run(step, "charge")
    ctx.set_attributes(stage="charged")
    second = yield ctx.run(step, "ship")
    ctx.set_attributes({"stage": "shipped", "vip": amount >= 100})
    return [first, second]


@weft.workflow(name="visibility.bad_attribute", attributes={"amount": float})
def bad_attribute(ctx, name: str, value):
    ctx.set_attributes(**{name: value})
    yield ctx.run(step, "never")


@weft.workflow(name="visibility.caught_bad_attribute", attributes={"amount": float})
def caught_bad_attribute(ctx):
    try:
        ctx.set_attributes(amount="lots")
    except weft.InvalidSearchAttributeError as exc:
        ctx.set_attributes(amount=1.0)
        return str(exc)
    yield ctx.sleep(0)


@weft.workflow(name="visibility.waiter", attributes={"batch": str, "ticks": int})
def waiter(ctx, batch: str):
    ctx.set_attributes(batch=batch)
    n = 0
    while True:  # keeps its engine committing steps until cancelled
        yield ctx.run(step, f"tick-{n}")
        ctx.set_attributes(ticks=n)  # durable with the commit that records tick n's completion
        yield ctx.sleep("50ms")
        n += 1


@weft.workflow(name="visibility.failing", attributes={"batch": str})
def failing(ctx, batch: str, fail: bool = True):
    ctx.set_attributes(batch=batch)
    value = yield ctx.run(step, "a")
    if fail and FORK_VERSION["value"] == "v1":
        raise RuntimeError(f"bug in {value}")
    return value


@weft.workflow(name="visibility.tagged", attributes={"stage": str})
def tagged(ctx):
    def set_stage(value: str) -> str:
        ctx.set_attributes(stage=value)  # from an update handler: durable with the update's commit
        return value

    ctx.on_update("stage", set_stage)
    ctx.set_attributes(stage="new")
    yield ctx.wait_for_signal("done")
    return ctx.attributes
