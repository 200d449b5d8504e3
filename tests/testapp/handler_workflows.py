"""Workflows of the handler and local-step tests that engine subprocesses run too: updates interleaved
with steps (their replay order after a takeover), and local activities whose run is cancelled while
they run on the engine's loop."""

from __future__ import annotations

import time

import weft_django as weft

from .models import ActivityCall
from .workflows import add


@weft.workflow(name="tests.update_order")
def update_order(ctx, rounds: int = 3):
    """A log of what happened in order: updates (``u:`` applied, ``b:`` a handler that changed the log
    and then raised), signals (``s<i>:``) and activity results (``a<i>:``). Replay must rebuild it."""
    log: list[str] = []

    def note(value):
        log.append(f"u:{value}")
        return len(log)

    def broken(value):
        log.append(f"b:{value}")
        raise RuntimeError(f"broken after noting {value!r}")

    ctx.on_update("note", note)
    ctx.on_update("broken", broken)
    ctx.expose(log=lambda: list(log))
    for i in range(rounds):
        got = yield ctx.wait_for_signal("next")
        log.append(f"s{i}:{got}")
        total = yield ctx.run(add, i, 1)
        log.append(f"a{i}:{total}")
    return log


@weft.activity(local=True)
def local_mark(key: str) -> str:
    ActivityCall.objects.create(name="local_mark", key=key)
    return key


@weft.activity(local=True)
def local_until_cancelled(key: str, seconds: float) -> str:
    """Runs on the engine's loop until the run is cancelled (read on the loop's connection)."""
    from weft_django.models import Workflow

    ActivityCall.objects.create(name="local_until_cancelled", key=key)
    workflow_id = weft.activity_info().workflow_id
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if Workflow.objects.filter(pk=workflow_id, status="cancelled").exists():
            return "saw the cancel"
        time.sleep(0.05)
    return "no cancel"


@weft.workflow(name="tests.local_steps_cancelled", attributes={"stage": str})
def local_steps_cancelled(ctx, key: str, attributes: bool, seconds: float = 30.0):
    """Local steps, a cancel from outside while the second runs, then more local steps and an end, all
    in the same engine pass: nothing of that pass may land after the cancel. With ``attributes`` the
    pass also sets one (on PostgreSQL its commit then takes the general path, not the one statement)."""
    first = yield ctx.run(local_mark, f"{key}:before")
    seen = yield ctx.run(local_until_cancelled, key, seconds)
    if attributes:
        ctx.set_attributes(stage="after the cancel")
    after = yield ctx.run(local_mark, f"{key}:after")
    return {"first": first, "seen": seen, "after": after}
