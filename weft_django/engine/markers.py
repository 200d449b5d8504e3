"""The driver's side of ``ctx.patched`` / ``ctx.deprecate_patch`` and ``ctx.now()``
(weft_django/deterministic.py's ``RunHistory``), over one ``WorkflowRun``.

A patch marker is a step of kind ``patch`` named by the change id, recorded by the driver itself at
the position the call was made (like a memo step: in the next fenced commit, in order). Replay
decides a call at position p:

- the step at p is this change's marker, or the markers recorded from p on with nothing between
  include it: the new branch (the marker and those before it are consumed; a change whose marker is
  passed over this way answers True if the code asks for it later);
- this run recorded anything at p or later (a step, a timer, an applied update) and no marker: the
  run was recorded by code before the change, the old branch;
- otherwise the run reaches this point for the first time: the new branch, and the marker is written.

The answer is fixed per run and change id (a second call returns the first call's answer). A marker
the code no longer asks for (the patch and its deprecation removed) is skipped where an operation is
yielded, so removing the call at the end of a change's life does not break old histories.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Protocol

from ..exceptions import WorkflowDefinitionError
from ..store.histories import StepRecord

PATCH = "patch"
DRIVER_KINDS = frozenset({"memo", "race", PATCH})  # steps the driver records itself: no durable time of theirs


def skip_unasked(steps: dict[int, StepRecord], seq: int) -> int:
    """The position an operation yielded at ``seq`` takes: past the patch markers recorded there that
    the code did not ask for."""
    while (step := steps.get(seq)) is not None and step.kind == PATCH:
        seq += 1
    return seq


class MarkedRun(Protocol):
    """What DriverHistory reads and moves of its run: engine/driver.py's ``WorkflowRun`` (which imports
    this module)."""

    next_seq: int

    @property
    def steps(self) -> Mapping[int, StepRecord]: ...

    @property
    def last_position(self) -> int: ...

    @property
    def in_code(self) -> bool: ...

    @property
    def clock(self) -> datetime | None: ...

    def start_at(self, position: int) -> datetime | None: ...

    def record_marker(self, step: StepRecord) -> None: ...


class DriverHistory:
    """``RunHistory`` for the context of one ``WorkflowRun``."""

    def __init__(self, run: MarkedRun) -> None:
        self._run = run
        self._decided: dict[str, bool] = {}

    @property
    def position(self) -> int:
        return self._run.next_seq

    def in_code(self) -> bool:
        return self._run.in_code

    def now(self) -> datetime:
        # The latest durable time fed to the code, and never before the start this position counts
        # from: a fork's own start from its fork point on, its source's below it.
        times = [when for when in (self._run.clock, self._run.start_at(self._run.next_seq)) if when is not None]
        if not times:  # a hand-made history without the run's start time
            raise WorkflowDefinitionError("ctx.now(): this run has no recorded start time.")
        return max(times)

    def patched(self, change_id: str, *, deprecated: bool) -> bool:
        decided = self._decided.get(change_id)
        if decided is not None:
            return decided
        run = self._run
        seq = run.next_seq
        found = self._marker(change_id, seq)
        step = run.steps.get(seq)
        if found is not None:
            for unasked in range(seq, found):  # changes taken at this point that the code asks for later, or no more
                self._decided.setdefault(run.steps[unasked].name, True)
            run.next_seq = found + 1
            taken = True
        elif deprecated:
            taken = True
        elif step is not None or self._recorded_from(seq):
            taken = False
        else:
            run.record_marker(StepRecord(seq, PATCH, change_id, "completed", "true"))
            run.next_seq += 1
            taken = True
        self._decided[change_id] = taken
        return taken

    def _marker(self, change_id: str, seq: int) -> int | None:
        """The position of this change's marker among the markers recorded at ``seq`` and after it
        with nothing between (the changes one turn of the code took there), or None. Markers before it
        are of changes whose calls were removed (a ``deprecate_patch`` at the end of its life) or come
        later in the code: they are passed over, as ``skip_unasked`` passes them at a yield."""
        steps = self._run.steps
        while (step := steps.get(seq)) is not None and step.kind == PATCH:
            if step.name == change_id:
                return seq
            seq += 1
        return None

    def _recorded_from(self, seq: int) -> bool:
        """Whether this run recorded anything (a step, a timer, an applied update) at ``seq`` or later:
        the run's highest position, not a scan of its history (which made each new change's first
        call on the live path cost the whole history)."""
        return self._run.last_position >= seq
