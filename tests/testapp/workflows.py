"""Workflows and activities the engine tests drive. Activities count their calls in the database
(ActivityCall rows), so tests can assert how often each ran across processes."""

from __future__ import annotations

import contextlib
import time

import weft_django as weft

from .models import ActivityCall, Reservation


def _count(name: str, key: str = "") -> int:
    ActivityCall.objects.create(name=name, key=key)
    return ActivityCall.objects.filter(name=name, key=key).count()


@weft.activity
def add(a: int, b: int) -> int:
    return a + b


@weft.activity
def record_call(key: str) -> str:
    _count("record_call", key)
    return key


@weft.activity
def slow_step(key: str, seconds: float) -> str:
    _count("slow_step", key)
    time.sleep(seconds)
    return key


@weft.activity(retry=weft.RetryPolicy(max_attempts=3, initial_backoff="10ms", max_backoff="50ms"))
def flaky(key: str, fail_times: int) -> int:
    calls = _count("flaky", key)
    if calls <= fail_times:
        raise ConnectionError(f"failure {calls}")
    return calls


@weft.activity(retry=weft.RetryPolicy(max_attempts=5, initial_backoff="10ms", non_retryable=["ValueError"]))
def refuses(key: str) -> None:
    _count("refuses", key)
    raise ValueError("bad input")


@weft.activity(atomic=True)
def reserve(order_id: int) -> int:
    Reservation.objects.create(order_id=order_id)
    return order_id


@weft.activity
def info() -> dict:
    i = weft.activity_info()
    return {"attempt": i.attempt, "epoch": i.epoch, "key": i.idempotency_key, "seq": i.seq}


@weft.workflow(name="tests.three_steps")
def three_steps(ctx, key: str):
    a = yield ctx.run(record_call, f"{key}-1")
    b = yield ctx.run(record_call, f"{key}-2")
    c = yield ctx.run(record_call, f"{key}-3")
    return [a, b, c]


@weft.workflow(name="tests.sum")
def sum_workflow(ctx, a: int, b: int):
    total = yield ctx.run(add, a, b)
    return {"total": total}


@weft.workflow(name="tests.retrying")
def retrying(ctx, key: str, fail_times: int):
    try:
        calls = yield ctx.run(flaky, key, fail_times)
    except weft.ActivityError as error:
        return {"error": error.type, "attempts": error.attempts, "message": error.message}
    return {"calls": calls}


@weft.workflow(name="tests.non_retryable")
def non_retryable(ctx, key: str):
    try:
        yield ctx.run(refuses, key)
    except weft.ActivityError as error:
        return {"type": error.type, "attempts": error.attempts}


@weft.workflow(name="tests.signals")
def waits_for_signal(ctx, timeout=None):
    try:
        payload = yield ctx.wait_for_signal("go", timeout=timeout)
    except weft.WaitTimeoutError:
        return "timed out"
    return payload


@weft.workflow(name="tests.sleeper")
def sleeper(ctx, seconds: float):
    yield ctx.sleep(seconds)
    return "woke"


@weft.workflow(name="tests.parallel")
def parallel(ctx):
    a, b = yield ctx.all([ctx.run(add, 1, 2), ctx.run(add, 3, 4)])
    index, value = yield ctx.race([ctx.wait_for_signal("never"), ctx.run(add, 5, 6)])
    return {"all": [a, b], "race": [index, value]}


@weft.workflow(name="tests.memo")
def memo(ctx):
    counter = {"n": 0}

    def compute():
        counter["n"] += 1
        return {"token": "abc", "tuple": (1, 2)}

    value = yield ctx.memo("token", compute)
    yield ctx.run(add, 1, 1)
    return value


@weft.workflow(name="tests.fails")
def fails(ctx):
    yield ctx.run(add, 1, 1)
    raise RuntimeError("workflow code broke")


@weft.workflow(name="tests.atomic")
def atomic_workflow(ctx, order_id: int):
    value = yield ctx.run(reserve, order_id)
    return value


@weft.workflow(name="tests.info")
def info_workflow(ctx):
    value = yield ctx.run(info)
    return value


@weft.workflow(name="tests.slow")
def slow(ctx, key: str, steps: int, seconds: float):
    out = []
    for i in range(steps):
        out.append((yield ctx.run(slow_step, f"{key}-{i}", seconds)))
    return out


CANCEL_HANDLER_CALLS: list[str] = []


@weft.workflow(name="tests.cancellable")
def cancellable(ctx):
    ctx.on_cancel(lambda: CANCEL_HANDLER_CALLS.append(ctx.workflow_id))
    yield ctx.wait_for_signal("never")


@weft.workflow(name="tests.replay_check")
def replay_check(ctx):
    first = yield ctx.run(add, 1, 1)
    second = yield ctx.wait_for_signal("continue")
    return [first, second]


@weft.workflow(name="tests.yields_in_finally")
def yields_in_finally(ctx):
    try:
        yield ctx.wait_for_signal("never")
    finally:
        yield ctx.sleep(1)  # a detached context answers with an inert operation


@weft.activity(timeout="300ms", retry=weft.RetryPolicy(max_attempts=2, initial_backoff="10ms"))
def too_slow(key: str) -> str:
    calls = _count("too_slow", key)
    for _ in range(20):
        time.sleep(0.05)
        weft.heartbeat({"call": calls})
    return "finished"


@weft.workflow(name="tests.timeouts")
def timeouts(ctx, key: str):
    try:
        yield ctx.run(too_slow, key)
    except weft.ActivityError as error:
        return {"type": error.type, "attempts": error.attempts}
    return "no timeout"


@weft.activity
def reports_progress(key: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    step = 0
    while time.monotonic() < deadline:
        step += 1
        weft.heartbeat({"step": step})
        time.sleep(0.02)
    return key


@weft.workflow(name="tests.progress")
def progress(ctx, seconds: float):
    state = {"stage": "working"}
    ctx.expose(stage=lambda: state["stage"])
    ctx.on_query("echo", lambda value=None: value)
    result = yield ctx.run(reports_progress, "p", seconds)
    state["stage"] = "waiting"
    yield ctx.wait_for_signal("done")
    return result


@weft.workflow(name="tests.uncaught_activity_error")
def uncaught_activity_error(ctx, key: str):
    yield ctx.run(add, 1, 1)
    yield ctx.run(refuses, key)  # its ActivityError is not caught: the run fails at seq 1


@weft.workflow(name="tests.caught_then_fails")
def caught_then_fails(ctx, key: str):
    with contextlib.suppress(weft.ActivityError):
        yield ctx.run(refuses, key)
    raise RuntimeError("code failed after handling the activity error")


@weft.activity(atomic=True, timeout="300ms", retry=weft.RetryPolicy(max_attempts=2, initial_backoff="10ms"))
def slow_first_reservation(order_id: int) -> int:
    attempt = weft.activity_info().attempt
    Reservation.objects.create(order_id=order_id * 10 + attempt)
    if attempt == 1:
        time.sleep(0.8)  # past the timeout: this attempt's writes must never commit
    return attempt


@weft.workflow(name="tests.atomic_timeout")
def atomic_timeout(ctx, order_id: int):
    return (yield ctx.run(slow_first_reservation, order_id))


@weft.activity(retry=weft.RetryPolicy(max_attempts=5, initial_backoff="50ms"))
def chaos_step(key: str, seconds: float) -> str:
    _count("chaos_step", key)
    time.sleep(seconds)
    return key


@weft.workflow(name="tests.chaos_ten")
def chaos_ten(ctx, key: str, seconds: float):
    results = []
    for i in range(10):
        results.append((yield ctx.run(chaos_step, f"{key}:{i}", seconds)))
    return len(results)


@weft.workflow(name="tests.blocking_code")
def blocking_code(ctx, seconds: float):
    first = yield ctx.run(add, 1, 1)
    time.sleep(seconds)  # workflow code hogging the engine loop (bad practice; renewal must not care)
    second = yield ctx.run(add, first, 1)
    return second
