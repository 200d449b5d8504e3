"""Workflows whose local step holds the engine loop (tests/ownership/test_stuck_loop.py)."""

from __future__ import annotations

import os
import time

import weft_django as weft


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
