"""Residency: how many workflow generators an engine keeps in memory (``WEFT["MAX_RESIDENT_WORKFLOWS"]``).

Past the limit, idle parked workflows are evicted: their generator is closed and forgotten, their
claim stays held at its epoch (a dormant claim: engine/renewal.py renews it rarely, with a long TTL,
and the engine's heartbeat keeps it; ADR 0014). A wake-up naming one (a signal, an update, a transition),
a query addressed to it, or the sweep finding mail for it (the safety net behind LISTEN, once per
renew interval) recalls it: it is loaded again at the same epoch and replayed from its durable
history, as after a refused commit. Only a workflow that has nothing but durable state is evicted:
every leaf of its frontier waits for a signal or an update (and is armed), no attempt is running or due, it has no
timer (sleep, signal timeout, retry) and no execution deadline, no write of it waits for a
commit, and no wake-up naming it waits for the next pass (that would recall it at once)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from ..operations import WaitForSignal, WaitForUpdate
from ..store import mailbox
from . import ownership
from .host import EngineHost
from .owned import Owned

logger = logging.getLogger("weft_django.engine.engine")
# After an eviction scan found too few idle parked workflows (the rest sleep on timers, run attempts, ...),
# the next scan waits this long unless more workflows were loaded meanwhile: a scan walks every resident
# workflow, and an engine held over its limit by busy ones would otherwise walk them all on every pass.
SHORT_SCAN_RETRY = 1.0


class Residency:
    """The evicted workflows of one engine and the eviction policy.

    Args:
        limit: at most this many resident workflows (None: no limit, nothing is evicted).
        reload: called with (workflow id, epoch) to load a recalled workflow on the next pass.
    """

    def __init__(self, limit: int | None, reload: Callable[[str, int], None]) -> None:
        self.limit = limit
        self.reload = reload
        self.evicted: dict[str, int] = {}  # claim held, generator not in memory: workflow id -> epoch
        # The hash of the mail mark (store.mailbox.held_with_mail) a sweep last recalled each workflow
        # for: its context has read that mail, so the same mark on an evicted workflow is no reason to
        # load it. Only workflows with mail have an entry (an int, not the mark: a million parked).
        self._seen: dict[str, int] = {}
        self.evictions = 0
        self.recalls = 0
        self._short: tuple[float, int] | None = None  # after a short scan: (retry at, resident count then)

    def recall(
        self, engine: EngineHost, workflow_ids: Iterable[str], lost: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """Load these evicted workflows again (they got mail or a wake-up); forget the evicted ones
        whose claim was found ``lost`` at the epoch they were evicted at. Returns those whose claim
        this call renewed (id: epoch): the caller may load them at once, without renewing them again
        (``Engine._load_recalled``); all of them wait in the loop's reloads until loaded, and a later
        load renews them first (``Engine._claim``: a transition may move a claim in between).

        A dormant claim's loss is found late (its renewal is rare): this engine frozen past it, another
        engine took it over. So a recall renews the claims first (one round trip, only when a named
        workflow is evicted) and loads only those still held by this engine at their epoch; the others
        are forgotten, never replayed and driven by a non-owner. Renewed, not only read: a claim that had
        lapsed (its heartbeat stalled) but was not taken yet could be taken between a read and the load,
        and the workflow's next step (a local activity runs before the fenced commit) run on a non-owner.
        A claim whose row another transaction holds (a peer's takeover about to commit?) is kept if a read
        shows it still ours, and loaded only once a later pass renewed it. The same rule serves the loop's
        reloads (``ownership.held_to_load``).

        Raises:
            DatabaseError: the renewal failed (nothing is recalled: a later wake-up or sweep tries again).
        """
        for wid, gone in (lost or {}).items():
            if self.evicted.get(wid) == gone:
                del self.evicted[wid]
        if not self.evicted:
            return {}
        named = {wid: self.evicted[wid] for wid in workflow_ids if wid in self.evicted}
        if not named:
            return {}
        # Resident again: renewed with the TTL (raises before any pop); those found lost are logged, forgotten.
        renewed, later = ownership.held_to_load(engine, named, "dormant claim lost before its recall")
        for wid in named:
            del self.evicted[wid]
        for wid, epoch in {**renewed, **later}.items():  # the skipped ones wait for the pass's load, which renews
            self.recalls += 1
            self.reload(wid, epoch)
        return renewed

    def forget(self, workflow_ids: Iterable[str]) -> None:
        """Drop the evicted entries of these workflows: claimed again at a new epoch, the engine lost the
        claim it evicted them under (a dormant claim's loss is found late: at its next renewal or recall)."""
        if self.evicted:
            for wid in workflow_ids:
                self.evicted.pop(wid, None)

    def evict(self, engine: EngineHost) -> list[Owned]:
        """Evict idle parked workflows until at most ``limit`` are resident, oldest loaded first (never
        one that is ``busy``). Returns the evicted ones (their generators closed; the caller publishes
        the claims to renew)."""
        owned = engine.owned
        if self.limit is None or len(owned) <= self.limit:
            return []
        if self._short is not None and time.monotonic() < self._short[0] and len(owned) <= self._short[1]:
            return []
        excess = len(owned) - self.limit
        out: list[Owned] = []
        for wid, held in owned.items():  # oldest loaded first; stops once it has enough (no copy of all)
            if len(out) >= excess:
                break
            if idle_parked(held) and not busy(engine, wid):
                out.append(held)
        self._short = (time.monotonic() + SHORT_SCAN_RETRY, len(owned) - len(out)) if len(out) < excess else None
        for held in out:
            del owned[held.workflow_id]
            held.run.close()
            self.evicted[held.workflow_id] = held.epoch
        self.evictions += len(out)
        if out:
            logger.info(
                "evicted idle parked workflows count=%s resident=%s evicted=%s", len(out), len(owned), len(self.evicted)
            )
        return out

    def take_all(self, owned: dict[str, Owned]) -> dict[str, int]:
        """Every claim this engine holds (resident and evicted: id -> epoch), the evicted forgotten
        (shutdown releases them all)."""
        held = {**self.evicted, **{wid: o.epoch for wid, o in owned.items()}}
        self.evicted = {}
        return held

    def interval(self, engine: EngineHost) -> float:
        """The sweep's cadence: the renew interval (the mailbox sweep's, behind LISTEN)."""
        return engine.settings.workflow_claim_renew_interval.total_seconds()

    def sweep(self, engine: EngineHost, now: datetime) -> bool:
        """Recall the evicted workflows with a buffered signal or an admitted update they have not seen
        (a lost wake-up). Mail a context read before it was evicted (a signal of a name it does not
        wait for yet) is not a reason to load it again: a workflow recalled for a mark is not recalled
        for the same mark, only once its mail changes (a new signal or update, or one taken)."""
        if not self.evicted:
            self._seen = {}
            return False
        began = len(self.evicted)
        marks = {wid: hash(mark) for wid, mark in mailbox.held_with_mail(engine.engine_id, engine.using).items()}
        new = [wid for wid, mark in marks.items() if wid in self.evicted and self._seen.get(wid) != mark]
        # Noted only once the recall went through: a recall that raised (its renewal failed) loaded
        # nothing, and its mail must recall the workflow at the next sweep, not pass as read.
        self.recall(engine, new)
        # The marks of the workflows recalled now; the others keep theirs (a resident one's old mark:
        # mail its context has not read yet must still recall it once evicted). Workflows with no mail
        # any more drop out, so this holds no more than the held workflows with mail.
        self._seen = {wid: self._seen[wid] for wid in marks if wid in self._seen} | {wid: marks[wid] for wid in new}
        return len(self.evicted) < began


def busy(engine: EngineHost, wid: str) -> bool:
    """Whether the next pass has work for this held workflow that no durable state records: writes
    waiting for a commit (carried), a mailbox not looked at yet, or a wake-up naming it (a signal, a
    ``w:``, the look a wait armed in this pass asked for). Evicted, the wake-up would recall it at once:
    a load and a replay for nothing."""
    return wid in engine._carried or wid in engine.attention.unchecked or engine.wake.pending(wid)


def idle_parked(owned: Owned) -> bool:
    """Whether nothing but durable state would be lost by closing this workflow's generator."""
    run = owned.run
    # Not ``owned.clear_stuck``: it stays set on a context loaded with a stuck mark, long after the commit
    # that cleared the mark (a write not committed yet is carried: ``busy``), and kept it resident for good.
    if owned.inflight or owned.dispatch or owned.timers or owned.has_deadline:
        return False
    if run.finished or run.frontier is None or run.new_steps or run.responses:
        return False
    leaves = run.pending_leaves()
    # Armed, too: a wait the pass's cascade reached but left to the next pass (engine/cascade.py) has
    # no timeout timer written yet, and nothing would arm it once its generator is gone.
    return bool(leaves) and all(
        isinstance(leaf.op, WaitForSignal | WaitForUpdate) and leaf.seq in owned.armed for leaf in leaves
    )
