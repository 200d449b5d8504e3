"""Attention: which held workflows a pass must look at besides those its wake-ups name.

A pass serves what woke it (a NOTIFY naming a workflow, an activity's outcome, a timer). Three
kinds of work are not named by a wake-up: attempts waiting to be handed to the activity threads,
attempts in flight whose timeout may pass, and live contexts whose mailbox (admitted updates) was
not looked at since they were loaded. Found by scanning every held workflow, each pass cost time in
proportion to what the engine holds: with 4,000 parked workflows, signal -> result went from 2.2 to
4.0 ms p50 (docs/benchmarks.md, session 12). Here each kind is a set of workflow ids that the code
making the work adds to, and the pass reads only those.

Each set may still name a workflow that needs nothing any more (it was dropped, or its attempts
finished): its reader re-checks the condition on the live context and skips or forgets such ids. So
a set may hold too many ids, never too few; the rule for the writers is only "add where the work is
made".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from .activities import AttemptTask
from .owned import Owned


class Attention:
    """Per engine, the ids of held workflows with work no wake-up names (module docstring)."""

    __slots__ = ("dispatching", "running", "unchecked")

    def __init__(self) -> None:
        # Attempts appended to Owned.dispatch, to submit at the end of the pass; insertion-ordered
        # (a dict), so attempts are handed out in the order they were made, as when every held
        # workflow was walked in the order it was loaded.
        self.dispatching: dict[str, None] = {}
        # Attempts submitted (Owned.inflight non-empty): their timeouts are checked each pass.
        self.running: set[str] = set()
        # Contexts whose admitted updates no look has seen yet (a new context, or one a look put back).
        self.unchecked: set[str] = set()

    def queue(self, owned: Owned, task: AttemptTask) -> None:
        """Queue an attempt of ``owned`` for the loop's dispatch at the end of the pass."""
        owned.dispatch.append(task)
        self.dispatching[owned.workflow_id] = None

    def in_flight(self, owned: Mapping[str, Owned]) -> Iterator[Owned]:
        """The held workflows (of ``owned``, the loop's dict) with attempts in flight; ids whose
        workflow is gone or has none any more are forgotten on the way."""
        for wid in list(self.running):
            held = owned.get(wid)
            if held is None or not held.inflight:
                self.running.discard(wid)
            else:
                yield held
