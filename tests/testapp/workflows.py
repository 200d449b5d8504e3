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


@weft.workflow(name="tests.child")
def child(ctx, key: str, seconds: float = 0.0):
    value = yield ctx.run(slow_step, key, seconds)
    return {"child": value}


@weft.workflow(name="tests.failing_child")
def failing_child(ctx, key: str):
    yield ctx.run(refuses, key)


@weft.workflow(name="tests.parent")
def parent(ctx, key: str, children: int = 1, seconds: float = 0.0, policy: str = "terminate"):
    started = [
        ctx.start_child("tests.child", args=[f"{key}-{i}", seconds], parent_close_policy=policy)
        for i in range(children)
    ]
    results = yield ctx.all(started)
    return [r["child"] for r in results]


@weft.workflow(name="tests.parent_of_failure")
def parent_of_failure(ctx, key: str):
    try:
        yield ctx.start_child("tests.failing_child", args=[key], id=f"{key}-kid")
    except weft.ChildWorkflowError as error:
        return {"child_id": error.child_id, "status": error.status, "type": error.error.get("type")}


@weft.workflow(name="tests.parent_waits_forever")
def parent_waits_forever(ctx, policy: str):
    yield ctx.start_child("tests.signals", id=f"{ctx.workflow_id}-kid", parent_close_policy=policy)


@weft.workflow(name="tests.nested")
def nested(ctx, depth: int):
    if depth == 0:
        return 0
    below = yield ctx.start_child("tests.nested", args=[depth - 1])
    return below + 1


# -- schedules (tests/schedules/test_schedules*.py) --------------------------------------------------------


@weft.workflow(name="tests.scheduled_run")
def scheduled_run(ctx, label: str = ""):
    recorded = yield ctx.run(record_call, ctx.workflow_id)  # one ActivityCall row per execution
    return {"id": recorded, "label": label}


# -- messages: queries and updates (tests/client/test_messages*.py) -------------------------------------

from django import forms as _forms  # noqa: E402
from django.core.exceptions import ValidationError as _DjangoValidationError  # noqa: E402


class NoteForm(_forms.Form):
    text = _forms.CharField(max_length=10)
    priority = _forms.IntegerField(min_value=1)


def _pydantic_note() -> type:
    import pydantic

    class Note(pydantic.BaseModel):
        text: str
        priority: int

    return Note


def _positive_int(value):
    return None if isinstance(value, int) and not isinstance(value, bool) and value > 0 else "amount must be an int > 0"


def _django_style(value):
    if value != "ok":
        raise _DjangoValidationError({"value": ["must be 'ok'"], "__all__": ["rejected as a whole"]})


def _slow_add(payload):
    """A handler that takes its time and leaves a trace outside the database, so a test can kill its
    engine in the middle (test-only: real handlers do no I/O)."""
    import os

    with open(payload["marker"], "a") as marker:
        marker.write(f"{os.getpid()}\n")
    time.sleep(payload["sleep"])
    return payload["amount"]


@weft.workflow(name="tests.msg_counter")
def msg_counter(ctx, target: int = 10):
    state = {"count": 0, "notes": [], "stage": "counting", "calls": 0}
    ctx.expose(count=lambda: state["count"], stage=lambda: state["stage"])
    ctx.on_query("notes", lambda: list(state["notes"]))
    ctx.on_query("echo", lambda value="no arg": value)
    ctx.on_query("boom", lambda: 1 / 0)
    ctx.on_query("calls", lambda: state["calls"])

    def add(amount):
        state["calls"] += 1
        state["count"] += amount
        return state["count"]

    def slow_add(payload):
        state["calls"] += 1
        state["count"] += _slow_add(payload)
        return state["count"]

    def note(value):
        state["notes"].append(value)
        return len(state["notes"])

    def broken(value):
        state["count"] += 1000  # changes state, then fails: the change is part of the run's history
        raise RuntimeError(f"handler broke on {value!r}")

    ctx.on_update("add", add, validator=_positive_int)
    ctx.on_update("slow_add", slow_add)
    ctx.on_update("broken", broken)
    ctx.on_update("form_note", note, validator=NoteForm)
    ctx.on_update("typed_note", note, validator=_pydantic_note())
    ctx.on_update("multi", note, validator=lambda v: ["first problem", {"message": "second", "path": ["x", 0]}])
    ctx.on_update("django_note", note, validator=_django_style)
    ctx.on_update("bad_result", lambda v: object())
    ctx.on_update("validator_raises", note, validator=lambda v: 1 / 0)
    reached = yield ctx.wait_until(lambda: state["count"] >= target, timeout="1h")
    state["stage"] = "reached" if reached else "timed out"
    stop = yield ctx.wait_for_signal("stop")
    return {"count": state["count"], "reached": reached, "stop": stop, "notes": state["notes"]}


@weft.workflow(name="tests.msg_confirm")
def msg_confirm(ctx):
    state = {"confirmed": None}
    ctx.expose(confirmed=lambda: state["confirmed"])
    payload, respond = yield ctx.wait_for_update("confirm")
    state["confirmed"] = payload
    respond({"ok": True, "got": payload})
    second, respond_later = yield ctx.wait_for_update("confirm")
    total = yield ctx.run(add, 1, 2)  # the answer comes in a later commit than the step that took it
    respond_later({"total": total, "got": second})
    return [payload, second]


@weft.workflow(name="tests.msg_other")
def msg_other(ctx):
    yield ctx.wait_for_signal("never")


# -- Celery executor (tests/celery/test_celery*.py) -----------------------------------------------------
# Activities with executor="celery" run on a real worker (tests/celery_app.py). The gate is a file:
# a gated activity waits for it, so a test can act while the attempt is running.

import os as _os  # noqa: E402


def _wait_for_gate(gate: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not _os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)


@weft.activity(executor="celery", timeout="30s")
def celery_echo(key: str, value: object) -> dict:
    _count("celery_echo", key)
    info = weft.activity_info()
    return {"value": value, "attempt": info.attempt, "epoch": info.epoch, "pid": _os.getpid()}


@weft.activity(executor="celery", timeout="30s", retry=weft.RetryPolicy(max_attempts=3, initial_backoff="50ms"))
def celery_flaky(key: str, fail_times: int) -> int:
    calls = _count("celery_flaky", key)
    if calls <= fail_times:
        raise ConnectionError(f"failure {calls}")
    return calls


@weft.activity(
    executor="celery",
    timeout="30s",
    retry=weft.RetryPolicy(max_attempts=4, initial_backoff="50ms", non_retryable=["ValueError"]),
)
def celery_refuses(key: str) -> None:
    _count("celery_refuses", key)
    raise ValueError("bad input on a worker")


@weft.activity  # sent to Celery by the call below: .options(executor="celery") with no timeout
def celery_untimed(key: str) -> str:
    _count("celery_untimed", key)
    return key


@weft.activity(executor="celery", queue="weft-tests-other", timeout="30s")
def celery_other_queue(key: str) -> str:
    _count("celery_other_queue", key)
    return f"{key} via weft-tests-other"


@weft.activity(executor="celery", timeout="30s", atomic=True)
def celery_reserve(order_id: int) -> int:
    Reservation.objects.create(order_id=order_id)
    return order_id


@weft.workflow(name="tests.celery_tour")
def celery_tour(ctx, key: str, order_id: int):
    echoed = yield ctx.run(celery_echo, key, {"nested": (1, 2), "text": "é"})
    flaky = yield ctx.run(celery_flaky, key, 1)
    errors = {}
    for name, activity in (("refused", celery_refuses), ("untimed", celery_untimed.options(executor="celery"))):
        try:
            yield ctx.run(activity, key)
        except weft.ActivityError as error:
            errors[name] = {"type": error.type, "attempts": error.attempts, "message": error.message}
    other = yield ctx.run(celery_other_queue, key)
    reserved = yield ctx.run(celery_reserve, order_id)
    return {"echoed": echoed, "flaky": flaky, "errors": errors, "other": other, "reserved": reserved}


@weft.workflow(name="tests.celery_echo")
def celery_echo_workflow(ctx, key: str):
    return (yield ctx.run(celery_echo, key, key))


@weft.activity(executor="celery", timeout="30s")
def celery_progress(key: str, gate: str) -> str:
    _count("celery_progress", key)
    step = 0
    while not _os.path.exists(gate):
        step += 1
        weft.heartbeat({"step": step, "key": key})  # raises ActivityCancelledError once it should stop
        time.sleep(0.05)
    return key


@weft.workflow(name="tests.celery_progress")
def celery_progress_workflow(ctx, key: str, gate: str):
    return (yield ctx.run(celery_progress, key, gate))


@weft.activity(executor="celery", timeout="3s", retry=weft.RetryPolicy(max_attempts=6, initial_backoff="100ms"))
def celery_dies_first(key: str) -> dict:
    info = weft.activity_info()
    _count("celery_dies_first", f"{key}@{info.attempt}")
    if info.attempt == 1:
        time.sleep(60)  # the test SIGKILLs this worker meanwhile
    return {"attempt": info.attempt, "pid": _os.getpid()}


@weft.workflow(name="tests.celery_dies_first")
def celery_dies_first_workflow(ctx, key: str):
    return (yield ctx.run(celery_dies_first, key))


@weft.activity(executor="celery", timeout="60s")
def celery_gated(key: str, gate: str) -> dict:
    info = weft.activity_info()
    call = ActivityCall.objects.create(name="celery_gated", key=f"{key}@{info.attempt}/{info.epoch}")
    _wait_for_gate(gate)  # no heartbeat: the attempt runs to the end and meets the fence there
    return {"call": call.pk, "attempt": info.attempt, "epoch": info.epoch}


@weft.workflow(name="tests.celery_gated")
def celery_gated_workflow(ctx, key: str, gate: str):
    return (yield ctx.run(celery_gated, key, gate))


@weft.activity(executor="celery", timeout="4s", retry=weft.RetryPolicy(max_attempts=3, initial_backoff="50ms"))
def celery_gated_first(key: str, gate: str) -> dict:
    """Attempt 1 waits for the gate (past its 4 s timeout unless the gate opens); later attempts return."""
    info = weft.activity_info()
    ActivityCall.objects.create(name="celery_gated_first", key=f"{key}@{info.attempt}/{info.epoch}")
    if info.attempt == 1:
        _wait_for_gate(gate)
    return {"attempt": info.attempt, "epoch": info.epoch}


@weft.workflow(name="tests.celery_gated_first")
def celery_gated_first_workflow(ctx, key: str, gate: str):
    return (yield ctx.run(celery_gated_first, key, gate))


@weft.activity(timeout="30s")
def timed_add(a: int, b: int) -> dict:
    return {"sum": a + b, "pid": _os.getpid()}


@weft.workflow(name="tests.timed_sum")
def timed_sum(ctx, a: int, b: int):
    return (yield ctx.run(timed_add, a, b))


@weft.workflow(name="tests.celery_gated_then_wait")
def celery_gated_then_wait(ctx, key: str, gate: str):
    result = yield ctx.run(celery_gated, key, gate)
    yield ctx.wait_for_signal("finish")  # keeps the claim held while the test looks
    return result


# -- chaos suite (tests/chaos/) ------------------------------------------------------------------


# The timeout is generous because an attempt's clock starts before it leaves the engine's queue (see
# tests/chaos/test_engine_findings.py): under a burst, quick attempts time out waiting for a thread.
@weft.activity(timeout="2s", retry=weft.RetryPolicy(max_attempts=6, initial_backoff="20ms", max_backoff="200ms"))
def chaos_io(key: str, slow_first: bool = False, fail_first: bool = False) -> str:
    """Its first attempt fails, or sleeps past the 2 s timeout, when asked; later attempts are quick."""
    attempt = weft.activity_info().attempt
    _count("chaos_io", f"{key}@{attempt}")
    if attempt == 1 and fail_first:
        raise ConnectionError(f"{key}: the first attempt fails")
    time.sleep(2.5 if attempt == 1 and slow_first else 0.01)
    return key


@weft.workflow(name="tests.chaos_leaf")
def chaos_leaf(ctx, key: str):
    return (yield ctx.run(chaos_io, key))


@weft.workflow(name="tests.chaos_chain")
def chaos_chain(ctx, key: str, n: int = 0):
    """Three runs of continue-as-new (tests/chaos): each an activity, a child with the default id
    (``<key>/1`` in the first run, ``<key>/<run id>/1`` in a later one) and a sleep."""
    io = yield ctx.run(chaos_io, f"{key}:{n}")
    kid = yield ctx.start_child("tests.chaos_leaf", args=[f"{key}:kid{n}"])
    yield ctx.sleep(0.1)
    if n < 2:
        return ctx.continue_as_new(key, n + 1)
    return {"io": io, "kid": kid}


@weft.workflow(name="tests.chaos_mixed")
def chaos_mixed(ctx, key: str, slow: bool = False, fail: bool = False, child: bool = False):
    """Every kind of step: an activity (slowed or failing first), a sleep, a signal, updates with a
    validator (a wait_until on their effect), a child workflow, and a last activity. The result is
    fixed by the arguments and by what the test sends (signal "go" = key, updates "add" 1 and 2)."""
    state = {"total": 0, "adds": 0}

    def add(amount):
        state["total"] += amount
        state["adds"] += 1
        return state["total"]

    ctx.on_update("add", add, validator=_positive_int)
    ctx.expose(total=lambda: state["total"])
    first = yield ctx.run(chaos_io, f"{key}:first", slow, fail)
    yield ctx.sleep(0.2)
    go = yield ctx.wait_for_signal("go", timeout="10m")
    reached = yield ctx.wait_until(lambda: state["total"] >= 3, timeout="10m")
    kid = (yield ctx.start_child("tests.chaos_leaf", args=[f"{key}/kid"], id=f"{key}/kid")) if child else None
    last = yield ctx.run(chaos_io, f"{key}:last")
    return {
        "first": first,
        "go": go,
        "reached": reached,
        "total": state["total"],
        "adds": state["adds"],
        "kid": kid,
        "last": last,
    }


@weft.workflow(name="tests.queued_timeouts")
def queued_timeouts(ctx, n: int, seconds: float, timeout: float):
    """n quick activities at once, each well within its timeout (tests/chaos/test_engine_findings.py)."""
    slow = slow_step.options(timeout=timeout)
    return (yield ctx.all([ctx.run(slow, f"queued-{i}", seconds) for i in range(n)]))


# -- chaos suite: messages timed against activity completions (tests/chaos/audit.py) -------------


@weft.activity(timeout="10s", retry=weft.RetryPolicy(max_attempts=6, initial_backoff="20ms", max_backoff="200ms"))
def chaos_flip(key: str, seconds: float) -> int:
    """Records that it started (the client times its messages from that row), sleeps, and returns its
    attempt number: a re-run after a lost commit returns another value."""
    attempt = weft.activity_info().attempt
    _count("chaos_flip", f"{key}@{attempt}")
    time.sleep(seconds)
    return attempt


@weft.workflow(name="tests.chaos_approve")
def chaos_approve(ctx, key: str, seconds: float = 0.3):
    """An activity, then an update taken by wait_for_update, then a signal, then a last activity: the
    chaos client sends "approve", "poke" and "late" timed to land as the activities complete. The
    result is fixed by what the client sends (the activities' values only pick a branch, as in issue
    21 item 1: a re-run activity that returns another value would need another history)."""
    first = yield ctx.run(chaos_flip, f"{key}:a", seconds)
    payload, respond = yield ctx.wait_for_update("approve")
    respond({"key": key, "approved": payload})
    poke = yield ctx.wait_for_signal("poke", timeout="10m")
    if first >= 1:  # always: the branch depends on the recorded value
        yield ctx.run(chaos_flip, f"{key}:last", seconds)
    return {"approved": payload, "poke": poke}


from . import visibility_workflows  # noqa: E402, F401 - issue 19's workflows, registered in engine subprocesses too

# -- local activities (issue 16): run on the engine's loop thread, committed with the next commit --


@weft.activity(local=True)
def local_step(key: str, seconds: float = 0.0) -> str:
    _count("local_step", key)
    time.sleep(seconds)
    return key


@weft.activity(local=True, retry=weft.RetryPolicy(max_attempts=3, initial_backoff="10ms", max_backoff="50ms"))
def local_flaky(key: str, fail_times: int) -> int:
    calls = _count("local_flaky", key)
    if calls <= fail_times:
        raise ConnectionError(f"failure {calls}")
    return calls


@weft.workflow(name="tests.local_steps")
def local_steps(ctx, key: str, steps: int, seconds: float = 0.0):
    out = []
    for i in range(steps):
        out.append((yield ctx.run(local_step, f"{key}-{i}", seconds)))
    return out


@weft.workflow(name="tests.local_then_signal")
def local_then_signal(ctx, key: str):
    """A local step, then a signal wait: the step is durable before the workflow parks."""
    first = yield ctx.run(local_step, f"{key}-0")
    payload = yield ctx.wait_for_signal("go")
    second = yield ctx.run(slow_step.options(), f"{key}-1", 0.0)
    return [first, payload, second]


@weft.activity(local=True)
def local_who(workflow_id: str) -> str:
    """Records which engine ran it (its PostgreSQL application name) and which engine held the
    workflow's claim as it ran: a non-owner running a step shows up as the two differing."""
    import os

    from weft_django.models import WorkflowClaim

    me = os.environ.get("PGAPPNAME", "")
    holder = WorkflowClaim.objects.filter(pk=workflow_id).values_list("engine_id", flat=True).first()
    _count("local_who", f"{workflow_id}|ran={me}|holder=weft-{holder}")
    return me


@weft.workflow(name="tests.signal_then_local")
def signal_then_local(ctx):
    """Parks on a signal, then runs a local step recording who ran it and who owned the workflow."""
    payload = yield ctx.wait_for_signal("go")
    yield ctx.run(local_who, ctx.workflow_id)
    return payload


@weft.workflow(name="tests.local_flaky")
def local_flaky_workflow(ctx, key: str, fail_times: int):
    return (yield ctx.run(local_flaky, key, fail_times))


@weft.workflow(name="tests.big_result")
def big_result(ctx, size: int):
    """Returns a string of ``size`` characters (the R: wake-up carries it only under 8000 bytes)."""
    value = yield ctx.run(local_step, "big")
    return value + "x" * size


from . import queue_workflows  # noqa: E402,F401  the flow-control tests' workflows (tests/queues/)


@weft.workflow(name="tests.parent_races_child")
def parent_races_child(ctx):
    """Ends while its child (waiting for a signal) still runs: the engine closes it at the run's end."""
    index, _ = yield ctx.race([ctx.start_child("tests.signals", id=f"{ctx.workflow_id}-kid"), ctx.run(add, 1, 2)])
    return index


@weft.activity
def fork_and_terminate(seconds: float) -> int | None:
    """Fork a process as multiprocessing's "fork" start method does (Linux's default before Python
    3.14), then terminate it (SIGTERM): its exit code, None if it ignored the signal."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(seconds,))
    child.start()
    time.sleep(0.2)
    child.terminate()
    child.join(5)
    code = child.exitcode
    if code is None:
        child.kill()
        child.join()
    return code


@weft.workflow(name="tests.fork_and_terminate")
def fork_and_terminate_workflow(ctx, seconds: float):
    code = yield ctx.run(fork_and_terminate, seconds)
    return code


from . import (  # noqa: E402
    handler_workflows,  # noqa: F401  update order after a takeover, local steps of a cancelled run
    stuck_workflows,  # noqa: F401  a local step that holds the engine loop (tests/ownership/test_stuck_loop.py)
)
