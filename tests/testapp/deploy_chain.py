"""A workflow that continues as new (tests/deploys/test_continue_as_new*.py): an engine started with
WEFT["AUTODISCOVER_MODULE"] = "deploy_chain" runs it."""

from __future__ import annotations

from typing import Any

import weft_django as weft


@weft.workflow(name="tests.deploys.counter")
def counter(ctx: Any, n: int, total: int) -> Any:
    payload = yield ctx.wait_for_signal("add")
    total += payload
    if n + 1 < 3:
        if n % 2:
            return ctx.continue_as_new(n + 1, total)  # returned
        yield ctx.continue_as_new(n + 1, total=total)  # or yielded
    return {"runs": n + 1, "total": total}


@weft.workflow(name="tests.deploys.update_chain")
def update_chain(ctx: Any, n: int) -> Any:
    if n == 0:  # the first run never takes the update: it is admitted to it, then carried over
        yield ctx.wait_for_signal("next")
        return ctx.continue_as_new(1)
    payload, respond = yield ctx.wait_for_update("bump")
    respond(payload * 2)
    return payload


@weft.workflow(name="tests.deploys.parent_continues")
def parent_continues(ctx: Any, n: int) -> Any:
    if n == 0:  # the child loses the race and is still running when the run continues as new
        yield ctx.race([ctx.start_child("tests.signals", id="cn-orphan"), ctx.wait_for_signal("stop")])
        return ctx.continue_as_new(1)
    return "done"


@weft.workflow(name="tests.deploys.child_chain")
def child_chain(ctx: Any, n: int, ids: list[Any]) -> Any:
    """Each run races a child (id ``ids[n]``, None: the default) against a signal, at the same seqs:
    run 0's child loses to "stop" and is abandoned as the run continues; run 1 returns its child's result."""
    branches = [ctx.start_child("tests.signals", id=ids[n], parent_close_policy="abandon"), ctx.wait_for_signal("stop")]
    _, value = yield ctx.race(branches)
    if n == 0:
        return ctx.continue_as_new(1, ids)
    return value
