"""The claim ahead (``WEFT["CLAIM_AHEAD"]``): while a backlog waits, the pass's fenced commit runs on
its own thread and connection (engine/committer.py) and the loop, beside it, claims the next batch,
loads it and settles its cascade. The next batch's writes are carried to the next pass's commit, as
writes a locked row deferred are, so an attempt it arms is dispatched only after that commit.

What makes it safe:
- The loop touches nothing of the commit in flight: the claim ahead acquires unheld workflows only
  (no takeover, admission or delayed start), and one of the commit's own workflows claimed again at a
  new epoch (a transition released its claim meanwhile) is not loaded beside it: it goes to ``clash``,
  loaded by the next pass once the commit's result has been handled (its old context dropped).
- Every pass waits for its commit (the result is handled where a commit the loop made itself would
  be: events, deposals, ended runs), so nothing outside the pass ever sees a commit in flight.
- One commit at a time, and a workflow's writes go to the commit of the pass that made them or a
  later one: its writes become durable in the order it made them.
- An exception of the claim ahead is raised after the commit's result is handled (the loop's
  containment then reloads, as for any failed pass).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Protocol

from ..conf import WeftSettings
from ..status import OwnershipMode
from ..store.backend import backend
from ..store.commit import WorkflowWrites
from . import cascade
from .attention import Attention
from .claimer import Claimer
from .loader import Loader
from .owned import Owned, collect_recorded
from .progress import Progress
from .renewal import StoreLease
from .residency import Residency


class AheadHost(Protocol):
    """The loop as the claim ahead sees it (``Engine``)."""

    settings: WeftSettings
    using: str
    mode: str
    stopping: threading.Event
    owned: dict[str, Owned]
    claimer: Claimer
    lease: StoreLease
    loader: Loader
    progress: Progress
    attention: Attention
    residency: Residency
    claimed_ahead: int
    _carried: dict[str, WorkflowWrites]
    _reload: dict[str, int]

    def _drop(self, wid: str, reason: str | None) -> None: ...

    def _workflow_now(self, *, fresh: bool) -> datetime: ...

    def _publish_epochs(self) -> None: ...


def due(engine: AheadHost, claim: bool) -> bool:
    """Whether this pass's commit runs beside a claim ahead: a backlog waits (the last acquire was a
    full batch), WEFT["CLAIM_AHEAD"] is on, no throttle may hold the acquire back once the pass's
    attempts are dispatched, the database has concurrent writers, the loop's connection
    is not inside a caller's transaction (a second connection would not see it), the engine is not
    stopping and, in "lease" mode, holds the store lease.

    Args:
        engine: the loop.
        claim: the pass claims new work (off while draining).
    """
    if not (claim and engine.settings.claim_ahead and engine.claimer.backlog) or engine.stopping.is_set():
        return False
    if engine.attention.dispatching and engine.claimer.may_throttle():  # saturated or not is known after
        return False  # the dispatch: the throttle (engine/claimer.py) leaves a backlog to engines with room
    found = backend(engine.using)
    leased = engine.mode != OwnershipMode.LEASE or (engine.lease.epoch is not None and not engine.lease.lost)
    return found.concurrent_writers and not found.connection.in_atomic_block and leased


def claim_ahead(engine: AheadHost, inflight: set[str], clash: dict[str, int], failed: list[Exception]) -> None:
    """Beside the commit of ``inflight``'s writes: claim the next batch, load it, settle its cascade and
    carry its writes to the next pass (``engine.claimed_ahead``: how many it took).

    Args:
        engine: the loop.
        inflight: the workflows of the commit in flight (not touched).
        clash: filled with those of them (or of other held workflows) claimed again, id: new epoch.
        failed: filled with the exception this raised, if any (raised by ``after``).
    """
    try:
        claimed = engine.claimer.claim_ahead()
        clash.update({wid: claimed.pop(wid) for wid in list(claimed) if wid in inflight or wid in engine.owned})
        engine.claimed_ahead = len(claimed)
        if not claimed:
            return
        engine.residency.forget(claimed)  # an evicted entry of theirs is stale
        # Until loaded, before anything that can raise (the clock read too): they are this engine's claims.
        engine._reload.update(claimed)
        now, writes, changed = engine._workflow_now(fresh=False), dict[str, WorkflowWrites](), set[str]()
        engine.loader.load(claimed, now, writes, changed, preloaded=claimed.loaded, preloaded_for=claimed.loaded_for)
        for wid in claimed:
            engine._reload.pop(wid, None)
        engine._publish_epochs()
        cascade.settle_new(engine.progress, changed, now, writes)
        for owned in filter(None, map(engine.owned.get, claimed)):
            collect_recorded(owned, writes)
        engine._carried.update({wid: pending for wid, pending in writes.items() if not pending.empty})
    except Exception as exc:  # raised once the commit's result is handled
        failed.append(exc)


def after(engine: AheadHost, clash: dict[str, int], failed: list[Exception]) -> None:
    """Once the commit's result is handled: a workflow claimed again at a new epoch is loaded by the
    next pass (its old context dropped, if the result left it); the claim ahead's exception raised.

    Args:
        engine: the loop.
        clash: what ``claim_ahead`` left for the next pass, id: new epoch.
        failed: what it raised.
    """
    for wid, epoch in clash.items():
        owned = engine.owned.get(wid)
        if owned is not None and owned.epoch != epoch:
            engine._drop(wid, reason="claim taken again at a new epoch")
        engine._reload[wid] = epoch
    if failed:
        raise failed[0]


@contextlib.contextmanager
def handling(engine: AheadHost, clash: dict[str, int], failed: list[Exception]) -> Iterator[None]:
    """Around the handling of the commit's result: then ``after``. If the handling raised (a database
    error deposing a workflow the commit lost), the workflows claimed again are still handed to the
    next pass at their new epochs before that error goes on (the pass's containment reloads the others
    at the epochs of their contexts: one left at its old epoch would be looked for there and
    forgotten, its new claim held by this engine and driven by nobody until it lapsed); what the claim
    ahead raised is then dropped.

    Args:
        engine: the loop.
        clash: what ``claim_ahead`` left for the next pass, id: new epoch.
        failed: what it raised.
    """
    try:
        yield
    except BaseException:
        after(engine, clash, [])
        raise
    after(engine, clash, failed)


__all__ = ["AheadHost", "after", "claim_ahead", "due", "handling"]
