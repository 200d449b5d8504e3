"""Workflows and activities of the flow-control tests (tests/queues/). The activities record their own
start and end (ActivityCall rows named "q-start" / "q-end", key "<workflow id>|<pid>"), so a test can
compute how many ran at once across engine processes."""

from __future__ import annotations

import os
import time

import weft_django as weft

from .models import ActivityCall


def _mark(name: str) -> None:
    ActivityCall.objects.create(name=name, key=f"{weft.activity_info().workflow_id}|{os.getpid()}")


@weft.activity
def queued_work(seconds: float) -> int:
    _mark("q-start")
    time.sleep(seconds)
    _mark("q-end")
    return os.getpid()


@weft.workflow(name="tests.queued")
def queued(ctx, seconds: float = 0.0):
    return (yield ctx.run(queued_work, seconds))


@weft.workflow(name="tests.queued_default", queue="tests-default")
def queued_default(ctx):
    return (yield ctx.run(queued_work, 0.0))


@weft.workflow(name="tests.queued_parks")
def queued_parks(ctx):
    """Holds its slot while it waits for a signal (a parked run keeps its slot until it ends)."""
    yield ctx.wait_for_signal("go")
    return "went"


@weft.activity(concurrency=2)
def limited_work(seconds: float) -> int:
    _mark("a-start")
    time.sleep(seconds)
    _mark("a-end")
    return os.getpid()


@weft.activity(rate="5/s")
def rated_work() -> int:
    _mark("r-start")
    return os.getpid()


@weft.activity(concurrency_key=lambda customer, seconds: customer)
def charge(customer: str, seconds: float) -> str:
    ActivityCall.objects.create(name="c-start", key=customer)
    time.sleep(seconds)
    ActivityCall.objects.create(name="c-end", key=customer)
    return customer


@weft.workflow(name="tests.limited")
def limited(ctx, count: int, seconds: float):
    return (yield ctx.all([ctx.run(limited_work, seconds) for _ in range(count)]))


@weft.workflow(name="tests.rated")
def rated(ctx, count: int):
    return (yield ctx.all([ctx.run(rated_work) for _ in range(count)]))


@weft.workflow(name="tests.charges")
def charges(ctx, customers: list, seconds: float):
    return (yield ctx.all([ctx.run(charge, customer, seconds) for customer in customers]))


@weft.workflow(name="tests.queued_counter", queue="tests-default")
def queued_counter(ctx):
    """A queued workflow with an update and a signal (start_with_update / start_or_signal in a queue)."""
    state = {"count": 0}

    def add(amount):
        state["count"] += amount
        return state["count"]

    ctx.on_update("add", add)
    yield ctx.wait_for_signal("stop")
    return state["count"]


@weft.workflow(name="tests.queued_continues", queue="tests-default")
def queued_continues(ctx, n: int = 0):
    """Continues as new once, then parks on a signal (the next run of a continued queued workflow)."""
    if n == 0:
        return ctx.continue_as_new(1)
    return (yield ctx.wait_for_signal("go"))


@weft.workflow(name="tests.queued_parent")
def queued_parent(ctx, child: str, count: int, queue: str | None = None):
    """Starts ``count`` children of ``child`` at once (in ``queue`` if given, else the child's own)."""
    kwargs = {} if queue is None else {"queue": queue}
    starts = [ctx.start_child(child, args=[0.05] if child == "tests.queued" else [], **kwargs) for _ in range(count)]
    return len((yield ctx.all(starts)))


@weft.workflow(name="tests.queued_fails_once", queue="tests-default")
def queued_fails_once(ctx):
    """Fails the first time it runs, completes when retried (retry() of a queued workflow's run)."""
    done = yield ctx.run(fail_first_time)
    return done


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def fail_first_time() -> str:
    workflow_id = weft.activity_info().workflow_id
    if not ActivityCall.objects.filter(name="fail-once", key=workflow_id).exists():
        ActivityCall.objects.create(name="fail-once", key=workflow_id)
        raise RuntimeError("the first attempt fails")
    return "done"
