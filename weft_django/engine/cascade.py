"""The settle cascade of a pass: a workflow whose step settled (a memo, a wait_until, a consumed signal, a
local activity) is advanced to its new frontier, which may settle again at once, round after round.

A pass runs at most ``MAX_ROUNDS`` rounds (one local activity is one round: a workflow running thousands
in a row must not hold the loop for ever); the workflows still changed after them go on in the next
pass (``Progress.unsettled``), whose ``_quiet`` check sees them. Before, they were forgotten: their new
frontier was never armed and the run waited for nothing until its engine restarted."""

from __future__ import annotations

from datetime import datetime

from ..store.commit import WorkflowWrites
from .progress import Progress

MAX_ROUNDS = 1000


def settle(progress: Progress, changed: set[str], now: datetime, writes: dict[str, WorkflowWrites]) -> bool:
    """Advance ``changed`` (and the workflows the last pass left unsettled) for at most MAX_ROUNDS
    rounds; keep those still changed in ``progress.unsettled``. Returns whether any was left there
    (the loop then comes back at once)."""
    changed = changed | progress.unsettled
    progress.unsettled = set()
    for _ in range(MAX_ROUNDS):
        if not changed:
            break
        pending, changed = changed, set()
        for wid in pending:
            progress.advance(wid, now, writes, changed)
    progress.unsettled = {wid for wid in changed if wid in progress.owned}
    return bool(progress.unsettled)


def settle_new(progress: Progress, changed: set[str], now: datetime, writes: dict[str, WorkflowWrites]) -> bool:
    """``settle`` for ``changed`` only (the workflows a claim ahead just loaded, engine.py): the ones the
    last pass left unsettled may be in the commit in flight and wait for the next pass. Returns whether
    any was left unsettled."""
    earlier, progress.unsettled = progress.unsettled, set()
    try:
        return settle(progress, changed, now, writes)
    finally:
        progress.unsettled |= earlier
