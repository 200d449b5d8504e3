"""A stuck loop: a pass that does not end. Python cannot interrupt running code, so a local activity
or workflow code that never returns (a call without a timeout, a loop) holds the engine loop's thread
for as long as it runs, and with it every workflow the engine holds. Claim renewal has a thread of its
own and would go on renewing them all: the engine would look alive to its peers, and nothing it holds
would move again until it restarts.

So renewal asks ``LoopWatch.stuck`` before each pass: once the loop's current pass has run for twice
the claim TTL (``renewal.STUCK_PASS_TTLS``), it renews only the claim of the workflow the loop is
inside (found on the loop thread's stack, ``Stuck.workflow``) and writes no heartbeat, so its other
claims (dormant ones too) lapse and other engines take those workflows over, as from a frozen
engine. The one it is inside stays with it: taken over, it would stall its next engine the same way.
When the pass ends, renewal goes back to renewing whatever the loop still holds, and the loop learns
of the rest as lost claims; its late writes for them are refused by the fence (their epoch moved
on).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType, TracebackType


@dataclass(frozen=True)
class Stuck:
    """A pass running for ``seconds``: inside ``workflow`` (None: not inside one), at ``where``
    (the innermost ``file:line (function)`` of the loop's stack)."""

    seconds: float
    workflow: str | None
    where: str


class LoopWatch:
    """When the loop's current pass began, for the renewal thread (a context manager around a pass)."""

    def __init__(self) -> None:
        self.began: float | None = None  # time.monotonic() at the current pass's start; None between passes
        self.thread: int | None = None  # the loop thread's ident

    def __enter__(self) -> LoopWatch:
        self.thread = threading.get_ident()
        self.began = time.monotonic()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.began = None

    def stuck(self, limit: float, now: float) -> Stuck | None:
        """The current pass, when it has run for ``limit`` seconds or more at ``now`` (monotonic); else None."""
        began, thread = self.began, self.thread
        if began is None or thread is None or now - began < limit:
            return None
        frame = sys._current_frames().get(thread)
        if frame is None:
            return None
        return Stuck(now - began, _workflow_of(frame), _where(frame))


def _workflow_of(frame: FrameType | None) -> str | None:
    """The innermost workflow the stack is inside: a frame of the engine's with a local ``owned`` (an
    owned workflow) or ``self`` a run of the driver (its ``ctx``)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(_ENGINE_DIR):
            local = frame.f_locals
            owned = local.get("owned")
            workflow_id = getattr(owned, "workflow_id", None)
            if isinstance(workflow_id, str):
                return workflow_id
            ctx = getattr(local.get("self"), "ctx", None)
            workflow_id = getattr(ctx, "workflow_id", None)
            if isinstance(workflow_id, str):
                return workflow_id
        frame = frame.f_back
    return None


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} ({code.co_name})"


_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
