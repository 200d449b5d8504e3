"""A stuck loop: a call that does not return. Python cannot interrupt running code, so a local activity,
workflow code or a handler that never returns (a call without a timeout, a loop) holds the engine
loop's thread for as long as it runs, and with it every workflow the engine holds. Claim renewal has a
thread of its own and would go on renewing them all: the engine would look alive to its peers, and
nothing it holds would move again until it restarts.

So renewal asks ``LoopWatch.stuck`` before each pass: it samples the loop thread's stack, and once the
loop has been inside one call for twice the claim TTL (``renewal.STUCK_PASS_TTLS``), the rest of that
pass is stuck: renewal renews only the claim of the workflow the loop is inside (found on the loop
thread's stack, ``Stuck.workflow``) and writes no heartbeat, so its other claims (dormant ones too)
lapse and other engines take those workflows over, as from a frozen engine. The one it is inside
stays with it: taken over, it would stall its next engine the same way. One call, not one pass: a
long pass of many short calls (a thousand runs each with a short local step, woken together) is load,
not a stuck loop, and hands nothing over.

While it is stuck, renewal reports the claims peers took over as lost as soon as it sees them taken
(``Renewal._report_taken``), so that what is left of the pass once the call returns advances none of
them (``Progress.advance``) and dispatches none of their attempts (``Engine._dispatch``: a claim ahead,
engine/ahead.py, runs workflow code after the commit that recorded them). When the pass ends, the
loop renews what it still holds itself before its next pass and drops the rest first
(``LoopWatch.after_stuck``); renewal goes back to renewing whatever the loop still holds. Any late
write of the stuck pass for a workflow taken from it is refused by the fence (its epoch moved on).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, TracebackType


@dataclass(frozen=True)
class Stuck:
    """A stuck pass running for ``seconds``: inside ``workflow`` now (None: not inside one), at ``where``
    (the innermost ``file:line (function)`` of the loop's stack)."""

    seconds: float
    workflow: str | None
    where: str


class LoopWatch:
    """The loop's passes, for the renewal thread (a context manager around a pass).

    Args:
        after_stuck: called on the loop thread once a pass the renewal thread found stuck is over
            (before the next pass; a database error in it is its own to handle).
    """

    def __init__(self, after_stuck: Callable[[], object] | None = None) -> None:
        self.began: float | None = None  # time.monotonic() at the current pass's start; None between passes
        self.thread: int | None = None  # the loop thread's ident
        self.passes = 0  # passes begun
        self.after_stuck = after_stuck
        self.handed_over = False  # set by the renewal thread: a pass was stuck (read by the loop)
        # The renewal thread's own: the call it last saw the loop in, since when, and the pass found stuck.
        self._call: FrameType | None = None
        self._since = 0.0
        self._stuck_pass: int | None = None

    def __enter__(self) -> LoopWatch:
        self._settle()  # a pass found stuck just as it ended
        self.thread = threading.get_ident()
        self.passes += 1
        self.began = time.monotonic()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.began = None
        self._settle()

    def _settle(self) -> None:
        if self.handed_over:
            self.handed_over = False
            if self.after_stuck is not None:
                self.after_stuck()

    def stuck(self, limit: float, now: float) -> Stuck | None:
        """The current pass, when the loop has been inside one call of it for ``limit`` seconds or more
        (seen so at ``now``, monotonic, and at every earlier look since), or was so earlier in this pass;
        else None. Called by the renewal thread only, once a renewal: it samples the loop's stack."""
        began, thread, passes = self.began, self.thread, self.passes
        frame = sys._current_frames().get(thread) if began is not None and thread is not None else None
        if frame is None or began is None:
            self._call = None  # between passes: nothing of the last one is kept
            return None
        call, workflow = _call_of(frame)
        if call is not self._call:  # a new call (a frame kept here is never reused for another call)
            self._call, self._since = call, now
        if self._stuck_pass != passes and now - self._since < limit:
            return None
        self._stuck_pass = passes
        self.handed_over = True
        return Stuck(now - began, workflow, _where(frame))


def _call_of(frame: FrameType | None) -> tuple[FrameType | None, str | None]:
    """The call the stack is in: (the innermost frame of the engine's that runs a workflow's code, and
    that workflow; else the innermost frame of the engine's, and None). A workflow's frame is one with
    a local ``owned`` (an owned workflow) or ``self`` a run of the driver (its ``ctx``)."""
    innermost: FrameType | None = None
    while frame is not None:
        if frame.f_code.co_filename.startswith(_ENGINE_DIR):
            innermost = innermost or frame
            local = frame.f_locals
            owned = local.get("owned")
            workflow_id = getattr(owned, "workflow_id", None)
            if isinstance(workflow_id, str):
                return frame, workflow_id
            ctx = getattr(local.get("self"), "ctx", None)
            workflow_id = getattr(ctx, "workflow_id", None)
            if isinstance(workflow_id, str):
                return frame, workflow_id
        frame = frame.f_back
    return innermost, None


# The standard library's own code (a frozen module, or a file under the stdlib directory): a stuck call
# is reported at the innermost frame outside it, the user's code that called it, not at the
# ``os.path.exists`` or ``time.sleep`` wrapper the sample happened to land in.
_STDLIB = tuple(
    os.path.join(os.path.realpath(path), "")
    for path in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)


def _where(frame: FrameType) -> str:
    """Where the stuck call is: the innermost frame that is not the standard library's (else the innermost)."""
    found: FrameType | None = frame
    while found is not None and _in_stdlib(found.f_code.co_filename):
        found = found.f_back
    shown = found or frame
    code = shown.f_code
    return f"{code.co_filename}:{shown.f_lineno} ({code.co_name})"


def _in_stdlib(filename: str) -> bool:
    return filename.startswith("<frozen ") or os.path.realpath(filename).startswith(_STDLIB)


_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
