"""Signal delivery: a workflow parked on ``wait_for_signal`` (or on a child's end) consumes the buffered
records it waits for, each consumption in the same fenced commit as the step it settles.

Where the records come from. A context knows its mailbox (``Owned.signals_known``) once it has read
it: its load (PostgreSQL reads the buffered signals in the load's round trip) or a mailbox read
(``store.histories.buffered_signals``) returns the buffered records and the highest signal id the
read's snapshot saw (``Owned.signal_top``). From then on the context keeps that list current without
reading (``note_carried``):

- a signal sent since arrives in its ``S:`` wake-up with the row itself (store/notify.py). A row
  above ``signal_top`` was not visible to the read, so nobody had consumed it before that read; since
  the read only this context consumes this workflow's signals (the fence: a transition that takes
  the workflow from it moves the epoch), so the row is still buffered: it joins the list, and the
  top moves up to it (a second ``S:`` of the same row, late, is then at or below the top);
- a carried row at or below the top that the list does not hold (a signal whose transaction
  committed after the read's snapshot though its id came earlier, or one this context consumed)
  makes the mailbox unknown: the next look reads it;
- a signal too big to carry and a child's terminal record send ``w:`` instead, and a workflow a
  ``w:`` (or a sweep, or a rescan) names is read, or, when it waits for no signal then, its mailbox
  becomes unknown (a rescan also stands for ``S:`` wake-ups that may have been missed);
- what this context consumes leaves the list at once and stays in ``Owned.signals_taken`` until its
  commit is durable: a read meanwhile still sees it buffered (a commit deferred by a locked row).

So a workflow that only ``S:`` wake-ups or a newly armed wait named uses its known mailbox when it
has one, and a workflow that loops on a signal reads its mailbox once, not once per wait. A wait the
settle cascade arms takes its record from the known mailbox in that same pass (``deliver_known``), so
a backlog goes into one fenced commit, not one pass and one commit per record; but only where the
next pass would have delivered to it before anything else of the workflow: not while a wake-up naming
it waits to be noted, an admitted update waits for a look (a new context's, one looked at again, one
parked until the frontier moves: the next pass settles it after one record), or a timer of it is due
(a sleep or a wait_until's timeout at its frontier, its execution deadline: the next pass fires those
first; a wait's own timeout is no bar, a buffered signal beats it, ``before_timeouts``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from ..models import Timer
from ..operations import StartChild, WaitForSignal
from ..status import TimerKind
from ..store import histories
from ..store.commit import WorkflowWrites
from ..store.notify import BufferedRow
from . import steps
from .driver import StepRecord
from .frontier import Leaf
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


class Waits:
    """The leaves of one workflow that consume a buffered record, by the mailbox each consumes (its
    signal's name, or its child's terminal record), in frontier order: a record finds its wait without
    walking the others' (a fan-out of n children, or of n signal names, would walk n * n / 2)."""

    def __init__(self, leaves: list[Leaf]) -> None:
        self._by_name: dict[str, deque[Leaf]] = {}
        for leaf in leaves:
            self._by_name.setdefault(mailbox_of(leaf), deque()).append(leaf)
        self._left = len(leaves)

    def __bool__(self) -> bool:
        """Whether a wait among them has not taken its record yet."""
        return self._left > 0

    def take(self, name: str, owned: Owned) -> Leaf | None:
        """The first of these leaves consuming ``name`` that is still pending, taken out; None if none.
        The ones before it that are not pending any more are dropped (a leaf settled, or cancelled by a
        race, never waits again): they are no longer waits left either."""
        queue = self._by_name.get(name)
        while queue:
            leaf = queue.popleft()
            self._left -= 1
            if owned.run.is_pending(leaf.seq):
                return leaf
        return None

    def put_back(self, leaf: Leaf) -> None:
        """Return a leaf ``take`` gave that still waits (it consumed another child's end) to the front."""
        self._by_name[mailbox_of(leaf)].appendleft(leaf)
        self._left += 1


def deliverable(owned: Mapping[str, Owned], using: str) -> bool:
    """Whether a buffered signal (or child-terminal record) waits for a workflow parked here (a read)."""
    wanted = {wid: {mailbox_of(leaf) for leaf in leaves} for wid, leaves in waiting(owned, list(owned)).items()}
    names = {name for names in wanted.values() for name in names}
    if not names:
        return False
    rows = histories.buffered_names(list(wanted), names, using)
    return any(name in wanted[wid] and run_id == owned[wid].run_id for wid, run_id, name in rows)


def note_carried(owned_map: Mapping[str, Owned], carried: Mapping[str, list[BufferedRow]]) -> None:
    """Add the signals ``S:`` wake-ups carried to the known mailboxes of these owned workflows, or
    forget a mailbox when a carried row may not be buffered any more (the rules above)."""
    for wid, rows in carried.items():
        owned = owned_map.get(wid)
        if owned is None or owned.signals_known is None:
            continue
        known = owned.signals_known
        for row in rows:
            if row[0] in known or row[0] in owned.signals_taken or str(row[2]) != owned.run_id:
                continue  # known already, consumed by this context (its read came first), another run's
            if owned.signal_top is None or row[0] <= owned.signal_top:
                owned.signals_known = None
                break
            known[row[0]] = row
            owned.signal_top = row[0]  # a late S: of it, once consumed and forgotten, is at or below


def _read(settler: Settler, workflow_ids: list[str]) -> list[BufferedRow]:
    """The mailbox read of these workflows; each context's ``signal_top`` moves up to the read's and
    its known mailbox becomes what the read saw, less what it consumed in a commit not durable yet."""
    rows, top = histories.buffered_signals(workflow_ids, settler.using)
    for wid in workflow_ids:
        owned = settler.owned[wid]
        if top is None:  # (no top without prepared reads, e.g. SQLite: no S: wake-ups there either)
            continue
        owned.signal_top = top if owned.signal_top is None else max(top, owned.signal_top)
        owned.signals_known = {known_row[0]: known_row for known_row in rows if _current(owned, known_row)}
    return rows


def _current(owned: Owned, row: BufferedRow) -> bool:
    """Whether a buffered row belongs in this context's known mailbox: its workflow and run, not
    consumed by it in a commit that is not durable yet."""
    return row[1] == owned.workflow_id and str(row[2]) == owned.run_id and row[0] not in owned.signals_taken


def _pending(writes: dict[str, WorkflowWrites], wid: str) -> set[int]:
    """The signals this workflow consumed in writes not committed yet (deferred ones included)."""
    pending = writes.get(wid)
    return {pk for pk, _seq in pending.signals_consumed} if pending is not None else set()


def deliver(
    settler: Settler,
    workflow_ids: set[str],
    carried: Mapping[str, list[BufferedRow]],
    must_read: set[str],
    now: datetime,
    writes: dict[str, WorkflowWrites],
    changed: set[str],
) -> bool:
    """Consume the buffered signals (and child-terminal records) these workflows wait for; each
    consumption and the step it settles go into the same commit. Returns whether any was.

    Args:
        settler: the engine's state machine (its owned workflows, settle, take_timer).
        workflow_ids: the workflows to look at.
        carried: the signals ``S:`` wake-ups carried, by workflow id (``note_carried``).
        must_read: the workflows whose mailbox is read whatever is known (a ``w:``, a sweep or a
            rescan named them); the others use their known mailbox when they have one (see above).
        now: workflow time of this pass; ``writes``, ``changed``: the pass's writes and cascade.
    """
    owned_map = settler.owned
    note_carried(owned_map, carried)
    wanted = waiting(owned_map, workflow_ids)
    for wid in must_read:  # named, but not waiting now: what was named is read when a wait is armed
        if wid not in wanted and wid in owned_map:
            owned_map[wid].signals_known = None
    if not wanted:
        return False
    waits = {wid: Waits(leaves) for wid, leaves in wanted.items()}
    mailboxes: dict[str, list[BufferedRow]] = {}
    unread = []
    for wid in sorted(wanted):
        owned = owned_map[wid]
        owned.signals_taken &= _pending(writes, wid)  # the rest are durable: no read shows them buffered
        if wid not in must_read and owned.signals_known is not None:
            mailboxes[wid] = list(owned.signals_known.values())
        else:
            unread.append(wid)
    if unread:
        for row in _read(settler, unread):
            mailboxes.setdefault(row[1], []).append(row)
    delivered = False
    for wid in sorted(mailboxes):
        owned = owned_map[wid]
        for pk, _, run_id, name, payload, sent in mailboxes[wid]:
            if not waits[wid]:
                break  # every wait of this workflow has its record: the rest of a backlog stays for later passes
            delivered |= _consume(settler, owned, waits[wid], pk, run_id, name, payload, sent, now, writes, changed)
    return delivered


def deliver_known(
    settler: Settler, owned: Owned, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]
) -> bool:
    """Consume, in the pass that armed them, the records a workflow's new waits take from its known
    mailbox (no read); whether any was. A workflow looping on a signal with a backlog then takes the
    next record in the same settle cascade (engine/cascade.py), each consumption and its step in the
    pass's one fenced commit in the order it made them, instead of one pass and one commit per record.

    It does what the next pass's ``deliver`` would do with the same known mailbox; the caller leaves it
    to that pass when a wake-up for the workflow waits (a ``w:``, an ``S:`` to note, a rescan), whose
    rows may belong before the known ones, or an admitted update may (a new context's, one looked at
    again or parked: the next pass settles it after one record); and so does this when a timer of the
    workflow is due, which that pass fires first (module docstring).
    """
    if not owned.signals_known or _timer_due(owned, now):
        return False
    leaves = waiting(settler.owned, [owned.workflow_id]).get(owned.workflow_id)
    if not leaves:
        return False
    waits = Waits(leaves)
    delivered = False
    for pk, _, run_id, name, payload, sent in list(owned.signals_known.values()):
        if not waits:
            break
        delivered |= _consume(settler, owned, waits, pk, run_id, name, payload, sent, now, writes, changed)
    return delivered


def _timer_due(owned: Owned, now: datetime) -> bool:
    """Whether a timer that settles a leaf of this workflow's frontier (a sleep, a wait_until's timeout)
    or ends its run (the execution deadline) is due at ``now`` (armed due, as a race's ``sleep(0)``; or
    passed while a local step of this pass ran): the next pass fires it before any delivery."""
    if owned.deadline is not None and owned.deadline <= now:
        return True
    for leaf in owned.run.pending_leaves():
        for kind in (TimerKind.SLEEP, TimerKind.WAIT_CONDITION):
            timer = owned.timers.get((kind, leaf.seq))
            if timer is not None and timer.fire_at <= now:
                return True
    return False


def _consume(
    settler: Settler,
    owned: Owned,
    waits: Waits,
    pk: int,
    run_id: object,
    name: str,
    payload: str,
    sent: str | None,
    now: datetime,
    writes: dict[str, WorkflowWrites],
    changed: set[str],
) -> bool:
    """Deliver one buffered record to the wait of ``owned`` it is for, if one waits for it; whether it was consumed."""
    if str(run_id) != owned.run_id or pk in owned.signals_taken:
        return False  # taken already (this pass, or an earlier one whose commit is not durable yet)
    leaf = waits.take(name, owned)
    if leaf is None:
        return False
    owned.signals_taken.add(pk)
    if owned.signals_known is not None:
        owned.signals_known.pop(pk, None)
    writes_of(owned, writes).signals_consumed.append((pk, leaf.seq))
    if isinstance(leaf.op, StartChild) and not ends_its_child(owned, leaf.seq, payload):
        waits.put_back(leaf)
        return True  # another child's end (consumed out of the way): the step waits for its own
    if not isinstance(leaf.op, StartChild):
        settler.take_timer(owned, TimerKind.SIGNAL_TIMEOUT, leaf.seq, writes)
    with delivery_span("weft.signal.deliver", owned, sent, {"weft.signal": name, "weft.seq": leaf.seq}):
        settler.settle(owned, steps.delivered(leaf, name, payload, now), writes, changed)
    return True


def before_timeouts(
    settler: Settler,
    due: Sequence[tuple[str, str, int, datetime]],
    carried: Mapping[str, list[BufferedRow]],
    must_read: set[str],
    now: datetime,
    writes: dict[str, WorkflowWrites],
    changed: set[str],
) -> None:
    """Deliver to the workflows whose signal wait's timeout is among the ``due`` timer entries, before
    the timers fire: a signal buffered by the time its wait times out is the wait's outcome (the timer
    is then taken and its entry is stale). Otherwise a wait with a timeout shorter than a pass (or 0)
    timed out with its signal already buffered, sent before the wait began.

    Args:
        settler: the engine's state machine.
        due: the timer heap's due entries (workflow id, kind, seq, fire time).
        carried, must_read, now, writes, changed: as for ``deliver``.
    """
    timing_out = set()
    for wid, kind, seq, fire_at in due:
        owned = settler.owned.get(wid)
        timer = owned.timers.get((kind, seq)) if owned is not None else None
        if kind == TimerKind.SIGNAL_TIMEOUT and timer is not None and timer.fire_at == fire_at:
            timing_out.add(wid)
    if timing_out:
        rows = {wid: carried[wid] for wid in timing_out if wid in carried}
        deliver(settler, timing_out, rows, must_read & timing_out, now, writes, changed)
