"""Signal delivery: a workflow parked on ``wait_for_signal`` (or on a child's end) consumes the buffered
records it waits for, each consumption in the same fenced commit as the step it settles.

Where the records come from. The mailbox read (``store.histories.buffered_signals``) returns the
buffered records and the highest signal id its snapshot saw (``Owned.signal_top``). A signal sent
since arrives in its ``S:`` wake-up (store/notify.py) with the row itself, and for a workflow that
only such wake-ups named this pass the engine uses those rows instead of reading the mailbox, when
it can tell that each is still buffered:

- a row whose id is above ``signal_top`` was not visible to this context's last read, so nobody had
  consumed it before that read (consuming needs the row to be seen); since that read, only this
  context consumes this workflow's signals (the fence), and it remembers what it took
  (``Owned.signals_taken``, which also keeps a read from handing out again a signal this context
  took in a pass whose commit was deferred);
- any other row (no read yet in this context, or an id at or below the top: a signal the read may
  have seen, or one whose transaction committed late) sends the workflow to the mailbox read.

A carried row nobody waits for stays buffered; the read made when a wait for it is armed finds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Protocol

from ..models import Timer
from ..operations import StartChild, WaitForSignal
from ..status import TimerKind
from ..store import histories
from ..store.commit import WorkflowWrites
from ..store.notify import BufferedRow
from . import steps
from .driver import Leaf, StepRecord
from .owned import Owned, delivery_span, ends_its_child, mailbox_of, writes_of


class Settler(Protocol):
    """What delivery needs of the engine's state machine (engine/progress.py's Progress)."""

    owned: dict[str, Owned]
    using: str

    def settle(self, owned: Owned, step: StepRecord, writes: dict[str, WorkflowWrites], changed: set[str]) -> None:
        """Record a settled step and let the cascade advance its workflow."""

    def take_timer(self, owned: Owned, kind: str, seq: int, writes: dict[str, WorkflowWrites]) -> Timer | None:
        """Disarm one of the workflow's timers."""


def waiting(owned: Mapping[str, Owned], workflow_ids: set[str] | list[str]) -> dict[str, list[Leaf]]:
    """The leaves of these owned workflows that consume a buffered record (signal or child end)."""
    found = {
        wid: [leaf for leaf in owned[wid].run.pending_leaves() if isinstance(leaf.op, WaitForSignal | StartChild)]
        for wid in workflow_ids
        if wid in owned
    }
    return {wid: leaves for wid, leaves in found.items() if leaves}


def deliverable(owned: Mapping[str, Owned], using: str) -> bool:
    """Whether a buffered signal (or child-terminal record) waits for a workflow parked here (a read)."""
    wanted = {wid: {mailbox_of(leaf) for leaf in leaves} for wid, leaves in waiting(owned, list(owned)).items()}
    names = {name for names in wanted.values() for name in names}
    if not names:
        return False
    rows = histories.buffered_names(list(wanted), names, using)
    return any(name in wanted[wid] and run_id == owned[wid].run_id for wid, run_id, name in rows)


def _usable(owned: Owned, rows: list[BufferedRow]) -> list[BufferedRow] | None:
    """The carried rows still buffered, oldest arrival first, or None when one of them may not be
    (the mailbox is read instead)."""
    top = owned.signal_top
    if top is None:
        return None
    fresh = []
    for row in rows:
        if row[0] in owned.signals_taken:
            continue  # this context consumed it already (its read came first)
        if row[0] <= top:
            return None
        fresh.append(row)
    return fresh


def _read(settler: Settler, workflow_ids: list[str]) -> list[BufferedRow]:
    """The mailbox read of these workflows; each context's ``signal_top`` moves up to the read's.
    A signal this context took stays in ``signals_taken`` while the read still shows it buffered
    (its commit was deferred: engine.py ``_carried``), or while it is above the top."""
    rows, top = histories.buffered_signals(workflow_ids, settler.using)
    buffered = {row[0] for row in rows}
    for wid in workflow_ids:
        owned = settler.owned[wid]
        if top is not None and (owned.signal_top is None or top > owned.signal_top):
            owned.signal_top = top
        ceiling = owned.signal_top  # (None without prepared reads, e.g. SQLite: no S: wake-ups there)
        owned.signals_taken = {
            pk for pk in owned.signals_taken if pk in buffered or (ceiling is not None and pk > ceiling)
        }
    return rows


def deliver(
    settler: Settler,
    workflow_ids: set[str],
    carried: Mapping[str, list[BufferedRow]],
    now: datetime,
    writes: dict[str, WorkflowWrites],
    changed: set[str],
) -> bool:
    """Consume the buffered signals (and child-terminal records) these workflows wait for; each
    consumption and the step it settles go into the same commit. Returns whether any was.

    Args:
        settler: the engine's state machine (its owned workflows, settle, take_timer).
        workflow_ids: the workflows to look at.
        carried: for workflows only ``S:`` wake-ups named, the signals those carried (see above).
        now: workflow time of this pass; ``writes``, ``changed``: the pass's writes and cascade.
    """
    owned_map = settler.owned
    wanted = waiting(owned_map, workflow_ids)
    if not wanted:
        return False
    rows: list[BufferedRow] = []
    unread = []
    for wid in sorted(wanted):
        usable = _usable(owned_map[wid], carried[wid]) if wid in carried else None
        if usable is None:
            unread.append(wid)
        else:
            rows.extend(usable)
    if unread:
        rows.extend(_read(settler, unread))
    delivered = False
    for pk, wid, run_id, name, payload, sent in rows:
        owned = owned_map[wid]
        if str(run_id) != owned.run_id or pk in owned.signals_taken:
            continue  # taken already (this pass, or an earlier one whose commit is not durable yet)
        leaf = next((lf for lf in wanted[wid] if mailbox_of(lf) == name and owned.run.is_pending(lf.seq)), None)
        if leaf is None:
            continue
        owned.signals_taken.add(pk)
        delivered = True
        writes_of(owned, writes).signals_consumed.append((pk, leaf.seq))
        if isinstance(leaf.op, StartChild) and not ends_its_child(owned, leaf.seq, payload):
            continue  # another child's end (consumed out of the way): the step waits for its own
        if not isinstance(leaf.op, StartChild):
            settler.take_timer(owned, TimerKind.SIGNAL_TIMEOUT, leaf.seq, writes)
        with delivery_span("weft.signal.deliver", owned, sent, {"weft.signal": name, "weft.seq": leaf.seq}):
            settler.settle(owned, steps.delivered(leaf, name, payload, now), writes, changed)
        wanted[wid] = [lf for lf in wanted[wid] if lf.seq != leaf.seq]
    return delivered
