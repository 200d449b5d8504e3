"""Workflows whose local step holds the engine loop (tests/ownership/test_stuck_loop.py)."""

from __future__ import annotations

import os
import time

import weft_django as weft

from .models import ActivityCall
from .workflows import add


@weft.activity(local=True)
def hold_the_loop(marker: str, seconds: float) -> str:
    """The first engine to run it is held for ``seconds`` (a call without a timeout); later runs return
    at once. ``marker``: a file the first run creates."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return "ran again"
    os.write(fd, os.environ.get("PGAPPNAME", "").encode())
    os.close(fd)
    time.sleep(seconds)
    return "held the loop"


@weft.workflow(name="tests.stuck_loop")
def stuck_loop(ctx, marker: str, seconds: float):
    return (yield ctx.run(hold_the_loop, marker, seconds))


# -- the review of the stuck-loop hand-over (tests/ownership/test_stuck_loop_*.py) --------------------


def _first(marker: str) -> bool:
    """Whether this call is the first to create ``marker`` (the file then names the engine's session)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, os.environ.get("PGAPPNAME", "").encode())
    os.close(fd)
    return True


def spin_in_workflow_code(marker: str, seconds: float) -> None:
    """An endless loop of workflow code (the first caller only; it ends after ``seconds``)."""
    if _first(marker):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pass


def block_in_handler(marker: str, seconds: float) -> str:
    """A handler's call without a timeout (the first caller only)."""
    if _first(marker):
        time.sleep(seconds)
        return "held"
    return "at once"


@weft.workflow(name="tests.stuck_code")
def stuck_code(ctx, marker: str, seconds: float):
    """Its code, in a live turn after the signal, holds the loop (the first engine to run that turn)."""
    got = yield ctx.wait_for_signal("go")
    spin_in_workflow_code(marker, seconds)
    return got


@weft.workflow(name="tests.stuck_replay")
def stuck_replay(ctx, marker: str, seconds: float):
    """Its replay (the first engine to load it with a history) holds the loop."""
    if ctx.is_replaying:
        spin_in_workflow_code(marker, seconds)
    first = yield ctx.run(add, 1, 2)
    got = yield ctx.wait_for_signal("go")
    return [first, got]


@weft.workflow(name="tests.stuck_handlers")
def stuck_handlers(ctx, marker: str, seconds: float):
    """Update ``hold`` (its handler), update ``checked`` (its validator), query ``peek`` and its cancel
    handler hold the loop (the first one called); the run waits for signal ``go``."""
    ctx.on_update("hold", lambda payload: block_in_handler(marker, seconds))
    ctx.on_update(
        "checked", lambda payload: "checked", validator=lambda payload: block_in_handler(marker, seconds) and None
    )
    ctx.on_update("note", lambda payload: f"noted {payload}")
    ctx.on_query("peek", lambda: block_in_handler(marker, seconds))
    ctx.on_cancel(lambda: block_in_handler(marker, seconds))
    got = yield ctx.wait_for_signal("go")
    return got


@weft.activity(local=True)
def counted_local(key: str, seconds: float = 0.0) -> str:
    """A local step that counts its calls (``ActivityCall``) and runs ``seconds``."""
    ActivityCall.objects.create(name="counted_local", key=key)
    time.sleep(seconds)
    return key


@weft.activity
def counted_remote(key: str) -> str:
    ActivityCall.objects.create(name="counted_remote", key=key)
    return key


@weft.workflow(name="tests.counted_steps")
def counted_steps(ctx, key: str, delay: float):
    """After a sleep of ``delay`` seconds: a local step, then a regular one, each counted."""
    yield ctx.sleep(delay)
    local = yield ctx.run(counted_local, f"{key}:local")
    remote = yield ctx.run(counted_remote, f"{key}:remote")
    return [local, remote]


@weft.workflow(name="tests.counted_after_signal")
def counted_after_signal(ctx, key: str):
    """On signal ``go``: a local step, then a regular one, each counted."""
    yield ctx.wait_for_signal("go")
    local = yield ctx.run(counted_local, f"{key}:local")
    remote = yield ctx.run(counted_remote, f"{key}:remote")
    return [local, remote]


@weft.activity(local=True)
def hold_until(marker: str, release: str) -> str:
    """The first run holds the loop until the file ``release`` exists; later runs return at once."""
    if not _first(marker):
        return "ran again"
    while not os.path.exists(release):
        time.sleep(0.05)
    return "held the loop"


@weft.workflow(name="tests.stuck_until")
def stuck_until(ctx, marker: str, release: str):
    return (yield ctx.run(hold_until, marker, release))


@weft.workflow(name="tests.stuck_in_turn")
def stuck_in_turn(ctx, markers: list[str], seconds: list[float]):
    """On signal ``go``, its turn takes the first of ``markers`` no other run took (writing its id in
    it) and spins for that marker's ``seconds``."""
    got = yield ctx.wait_for_signal("go")
    for marker, spin in zip(markers, seconds, strict=True):
        if _first(marker):
            with open(marker, "w") as handle:
                handle.write(ctx.workflow_id)
            deadline = time.monotonic() + spin
            while time.monotonic() < deadline:
                pass
            break
    return got


@weft.workflow(name="tests.brief_local_at")
def brief_local_at(ctx, key: str, at: float, seconds: float):
    """Sleeps until ``at`` (a Unix time: many runs wake in one pass), then one short local step."""
    yield ctx.sleep(max(0.0, at - ctx.now().timestamp()))
    return (yield ctx.run(counted_local, key, seconds))
