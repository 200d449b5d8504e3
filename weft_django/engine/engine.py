"""Engine: start-up gates, the loop, shutdown. No argparse, no Django command: runnable from tests.

One thread drives generators; a thread pool runs activities; renewal has its own thread and
connection; where the database listens (PostgreSQL) a listener thread turns NOTIFY into wake-ups.
Per wake the loop claims new work, settles finished activities, fires due timers of owned workflows,
delivers signals, advances generators, and commits every workflow's resulting writes in one fenced
commit. Activities are dispatched only after the commit that recorded their attempt (ordering rule).

The loop (``Engine``) holds its parts: wake-ups (wake.py), claimer, renewal and the store lease
(renewal.py), loader, the per-workflow state machine (progress.py). It keeps the pass, the fenced
commit and what it carries between passes (containment.py: whose fault a refused commit is), the clock.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections

from .. import events
from ..conf import WeftSettings, get_settings
from ..exceptions import WeftError
from ..status import OwnershipMode
from ..store import histories, runs
from ..store import sessions as store_sessions
from ..store.backend import backend
from ..store.clock import db_now
from ..store.commit import WorkflowWrites
from . import ahead, cascade, ownership, sessions, signal_delivery
from .activities import commit_atomic_attempt
from .attention import Attention
from .claimer import Claimer
from .committer import CommitThread
from .containment import LockedRows, contain_refused_commit, contain_tick_failure
from .executors import ActivityExecutors
from .fencing import fenced_commit
from .loader import Loader
from .messages import _state as mailbox_state
from .messages import deliver_messages, mailbox_sweep_due, prefetch_admitted
from .owned import Owned, collect_recorded, commit_time, mark_stuck, note_children
from .passclock import PassClock
from .periodic import Chores, builtin_tasks
from .progress import Progress
from .quiet import quiet
from .renewal import Renewal, StoreLease
from .residency import Residency
from .timers import TimerHeap
from .wake import Wake
from .wakeups import Listener

logger = logging.getLogger(__name__)
MAINTENANCE_DEFER = 3  # poll intervals a stream of wake-ups may hold back the maintenance scans
CLOCK_REUSE = 0.5  # seconds a database clock reading serves the passes that follow (PostgreSQL)
CARRY_RETRY = 0.05  # seconds before a commit deferred by a locked row is tried again (when nothing else wakes us)
_STOPPED_DRIVING = "stopped driving workflow=%s engine=%s epoch=%s reason=%s"  # testing.py parses it


def _delegate(part: str, name: str) -> Any:
    """A loop attribute that is ``name`` of the part ``part`` (read and written through)."""
    return property(
        lambda self: getattr(getattr(self, part), name),
        lambda self, value: setattr(getattr(self, part), name, value),
    )


class Engine:
    """The engine loop. ``start()``, then ``tick()`` passes (or ``run()``), then ``shutdown()``.

    Args:
        engine_id: this engine's id (default: host:pid:random).
        concurrency: activity threads (default: WEFT["ACTIVITY_CONCURRENCY"]).
        settings: the settings (default: the project's).
        drain_timeout: seconds ``run()`` lets running activities finish when stopped. ``queues``: the
            WEFT["QUEUES"] it admits from (None: all); ConfigurationError for an unknown one.
    """

    def __init__(
        self,
        engine_id: str | None = None,
        *,
        concurrency: int | None = None,
        settings: WeftSettings | None = None,
        drain_timeout: float = 10.0,
        queues: list[str] | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        self.using = self.settings.database
        self.engine_id = engine_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.concurrency, self.drain_timeout = concurrency or self.settings.activity_concurrency, drain_timeout
        self.mode = self.settings.ownership
        self.owned: dict[str, Owned] = {}
        self.timers = TimerHeap()
        self.stopping, self.refused_commits = threading.Event(), 0
        self.periodic, self.chores = builtin_tasks(), Chores()
        self.wake = Wake(self.engine_id)
        self.lease = StoreLease(self.engine_id, self.settings, self.using)
        self._session_limit = sessions.session_limit(self.settings)  # a frozen engine's locks end then
        commit_atomic = store_sessions.bounded_commit(
            functools.partial(commit_atomic_attempt, self.engine_id, self.using), self.using, self._session_limit
        )
        self.executor = ActivityExecutors(
            self.engine_id, self.concurrency, self.wake.up, commit_atomic, self.using, self.settings
        )
        taken_over, saturated = functools.partial(events.claim_taken_over, self), lambda: self.executor.saturated
        self.claimer = Claimer(
            self.engine_id, self.settings, self.using, taken_over, served=queues, saturated=saturated
        )
        renewal_failed = functools.partial(events.renewal_failed, self)
        self.renewal = Renewal(
            self.engine_id, self.settings, self.using, self._session_limit, self.wake, self.lease, renewal_failed
        )
        self.attention = Attention()  # held workflows with work no wake-up names (engine/attention.py)
        self.progress = Progress(
            self.engine_id, self.using, self.owned, self.timers, self.wake, self._refused, self.attention
        )
        self.progress.parked = mailbox_state(self).parked  # updates a moved frontier may take (deliver_known)
        self.loader = Loader(
            self.engine_id, self.using, self.progress, self._drop, functools.partial(prefetch_admitted, self)
        )
        self._threads_stop, self._threads = threading.Event(), list[threading.Thread]()
        self._reload: dict[str, int] = {}  # workflows to load again at these epochs (after a failed pass)
        self._reload_skipped = False  # the last renewal of _reload skipped a row another transaction held
        self.residency = Residency(self.settings.max_resident_workflows, lambda w, e: self._reload.__setitem__(w, e))
        # Writes a fenced commit deferred because another transaction held a row it needed (a user's open
        # transaction around cancel()): they open the next pass's writes, never overtaken by them.
        self._carried: dict[str, WorkflowWrites] = {}
        self._carry_retry_at, self.locked_rows = 0.0, LockedRows()
        self.commits = CommitThread(self.using, self._session_limit, f"weft-commit-{self.engine_id}")
        self.claimed_ahead = 0  # workflows the last commit's claim ahead took (engine/committer.py)
        self._last_maintenance = 0.0  # time.monotonic() when the maintenance scans last ran
        self.clock = PassClock(self.using)

    # The parts' state under the loop's old private names (engine/messages.py and tests use them).
    _lock = _delegate("wake", "lock")
    _wake = _delegate("wake", "event")
    _lost = _delegate("wake", "lost")
    _queries_waiting = _delegate("wake", "queries_waiting")
    _on_notify = _delegate("wake", "on_notify")
    _recheck_wait_until = _delegate("progress", "recheck_wait_until")

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Register the engine, take the store lease ("lease" mode), start renewal (and the listener);
        each write waits while the database refuses it for now (``ownership.retried_at_start_up``).

        Raises:
            EngineLeaseAcquisitionTimeoutError: "lease" mode and another engine kept the lease.
        """
        store_sessions.bind(self.using, self._session_limit)  # the loop's thread; unbound in shutdown()
        if not ownership.start_up(self, self.settings):  # its writes wait while the database refuses them
            return  # asked to stop meanwhile: run() shuts down
        if self.mode == OwnershipMode.LEASE:
            if self.lease.wait(self.stopping):  # it waits out database errors itself (renewal.StoreLease)
                self.claimer.take_over_now = True  # the lease holder takes every claim at once
        elif self.mode == OwnershipMode.NONE:
            self.claimer.take_over_now = True  # the single engine: its predecessor's claims are taken at once
        self._threads.append(self.renewal.thread(self._threads_stop, self.owned, self.residency.evicted))
        if backend(self.using).listens:
            self._threads.append(Listener(self.using, self.wake.on_notify, self._threads_stop))
        for thread in self._threads:
            thread.start()
        logger.info("engine started engine=%s mode=%s", self.engine_id, self.settings.ownership)

    def run(self, *, once: bool = False) -> None:
        """Run until stopped (or, with ``once``, until nothing is runnable now), then shut down."""
        self.start()
        try:
            while not self.stopping.is_set():
                busy = self.tick()
                if once and not busy and self.idle():
                    break
                if not busy:
                    self._wait()
            self._drain()
        finally:
            self.shutdown()
            connections[self.using].close()  # this thread's connection: nothing may outlive the engine

    def run_until_idle(self, timeout: float = 30.0) -> None:
        """Tick in this thread until nothing is runnable now (tests, the demo). Threads are started
        and stopped around it.

        Raises:
            TimeoutError: still busy after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        self.start()
        try:
            while time.monotonic() < deadline:
                busy = self.tick()
                if not busy and self.idle():
                    return
                if not busy:
                    self._wait(0.02)
            raise TimeoutError(f"run_until_idle: still busy after {timeout}s")
        finally:
            self.shutdown()

    def request_stop(self) -> None:
        """Stop the loop (``run`` drains and shuts down)."""
        self.stopping.set()
        self.wake.up()

    def idle(self) -> bool:
        """Whether nothing is runnable now: no attempt running or due, no commit carried, no timer
        due, nothing claimable, no signal waiting for a workflow parked here."""
        # An activity waiting out its retry back-off is still being processed, not parked.
        if self._carried or self._reload or self.executor.busy or self.progress.processing():
            return False
        next_fire = self.timers.next_fire_at()
        if next_fire is not None and next_fire <= db_now(self.using):
            return False
        return not self.claimer.claimable() and not self.progress.deliverable()

    def _check_store_lease(self) -> bool:
        """Whether this engine may drive workflows now ("lease" mode: while it holds the store lease;
        losing it deposes this engine for every workflow at once)."""
        if self.mode != OwnershipMode.LEASE:
            return True
        held, acquired = self.lease.hold(functools.partial(self._drop_all, "store lease lost"))
        self.claimer.take_over_now |= acquired  # the new holder takes every claim at once
        return held

    def shutdown(self) -> None:
        """Stop the threads, release the claims (and the lease), mark the engine stopped."""
        self._threads_stop.set()
        self.executor.shutdown(0)
        self.commits.close()  # idle: every pass waits for its commit
        held = {**self.claimer.stranded, **self._reload, **self.residency.take_all(self.owned)}
        if ownership.release_at_shutdown(self, held):  # each write tried again over a new connection
            events.claims_released(self, len(self.owned))
        for owned in self.owned.values():
            owned.run.close()
        self.owned.clear()
        self._publish_epochs()
        for thread in self._threads:
            thread.join(timeout=2)
        store_sessions.unbind(self.using)
        logger.info("engine stopped engine=%s", self.engine_id)

    def _drain(self) -> None:
        """Let running activities not given up on finish for at most drain_timeout; commit their results."""
        deadline = time.monotonic() + self.drain_timeout
        while (self.executor.awaited or self._carried) and time.monotonic() < deadline:
            self.tick(claim=False)
            self._wait(0.05)
        self.tick(claim=False)
        if self._carried:  # nothing of them is durable: the next owner replays those workflows
            logger.warning(
                "shutting down with deferred commits engine=%s workflows=%s (rows still locked elsewhere)",
                self.engine_id,
                sorted(self._carried),
            )
            self._carried = {}

    def _wait(self, seconds: float | None = None) -> None:
        timeout = seconds if seconds is not None else self.settings.poll_interval.total_seconds()
        if self._carried:
            timeout = min(timeout, max(0.0, self._carry_retry_at - time.monotonic()))
        self.wake.wait(timeout)

    # -- the tick ----------------------------------------------------------------------------
    def tick(self, *, claim: bool = True) -> bool:
        """One pass of the loop. Returns whether anything happened.

        Args:
            claim: claim new work in this pass (off while draining).
        """
        # The loop keeps its connection across ticks (reconnecting per tick would cost a backend fork
        # under CONN_MAX_AGE=0); it is closed after a database error, so the next tick reconnects.
        try:
            with self.renewal.watch:  # a pass that never ends hands the engine's claims over (engine/stall.py)
                return self._tick(claim)
        except DatabaseError:
            connections[self.using].close()
            logger.exception("database error in tick engine=%s; retrying", self.engine_id)
            self.reload_all()
            time.sleep(0.2)
            return False
        except Exception as exc:  # one workflow's handling failed: stick it, not the engine (containment.py)
            return contain_tick_failure(self, exc)

    def _tick(self, claim: bool) -> bool:
        arrivals, (lost_at, notified, rescan, carried, read) = self.wake.arrivals, self.wake.take()
        recalled = self.residency.recall(self, notified, lost_at)  # an evicted workflow a wake-up named: loaded again
        lost = {wid for wid, epoch in lost_at.items() if wid in self.owned and self.owned[wid].epoch == epoch}
        if not (lost or notified or rescan) and self._quiet(claim):
            return False
        now = self._workflow_now(fresh=rescan)
        busy = bool(lost)
        notified_owned = [wid for wid in notified if wid in self.owned]
        if lost:
            self._depose(lost)
        # Writes deferred by the last pass come first: this pass's writes for the same workflow join them.
        writes: dict[str, WorkflowWrites] = {wid: w for wid, w in self._carried.items() if wid in self.owned}
        self._carried = {}
        changed: set[str] = set()
        if claim and not self.stopping.is_set() and self.mode != OwnershipMode.LEASE:
            busy |= self._load_recalled(recalled, now, writes, changed)  # before the mail that woke them is delivered

        self.executor.poll(notified)  # outcomes remote workers committed (Celery)
        for outcome in self.executor.take_outcomes():
            busy = True
            self.progress.on_outcome(outcome, now, writes, changed)
        self.progress.expire_attempts(now, writes, changed)
        due = self.timers.pop_due(now)
        signal_delivery.before_timeouts(self.progress, due, carried, read, now, writes, changed)  # a signal wins
        for wid, kind, seq, fire_at in due:
            busy = True
            self.progress.on_timer(wid, kind, seq, fire_at, now, writes, changed)

        # Wake-ups first. The maintenance scans (signals and messages of every owned workflow, the
        # acquire scan, the periodic chores) are the safety net behind LISTEN: they run once per
        # POLL_INTERVAL on a tick with no wake-up to serve, or on any tick once MAINTENANCE_DEFER
        # intervals have passed, so a NOTIFY naming one workflow never waits behind them.
        poll = self.settings.poll_interval.total_seconds()
        since = time.monotonic() - self._last_maintenance
        overdue = since >= poll * MAINTENANCE_DEFER
        poll_due = since >= poll and (not (notified or busy) or overdue)
        if poll_due:
            self._last_maintenance = time.monotonic()
        sweep = poll_due and mailbox_sweep_due(self)
        # Only a sweep or a rescan reads every held workflow's mailbox; a wake-up pass costs what it names,
        # and a known mailbox stands for a read unless a w: or look_at named it (engine/signal_delivery.py).
        signal_check = set(self.owned) if sweep or rescan else {wid for wid in notified if wid in self.owned}
        if signal_check:
            carried, read = ({}, signal_check) if sweep or rescan else (carried, read)
            busy |= self.progress.deliver_signals(signal_check, carried, read, now, writes, changed)
        message_check = {wid for wid in read if wid in self.owned}  # admitted updates: w: (and new contexts)
        queries, self.wake.queries_waiting = self.wake.queries_waiting or poll_due or rescan, False
        busy |= deliver_messages(self, message_check, queries, now, writes, changed)

        if claim and not self.stopping.is_set() and self._check_store_lease():
            unknown = {wid for wid in notified if wid not in self.owned and wid not in self._reload}
            busy |= self._claim(now, writes, changed, force=bool(unknown) or rescan, scan=poll_due)
            if poll_due:  # a wake-up that arrived during this pass is served first (engine/periodic.py)
                woken = lambda: self.wake.arrivals != arrivals  # noqa: E731
                busy |= self.chores.run_due(self, self.periodic, now, woken, 0 if overdue else poll * MAINTENANCE_DEFER)

        busy |= cascade.settle(self.progress, changed, now, writes)  # settle cascades: memo, wait_until, local steps
        # A wake-up for a workflow we hold may be a transition that deposed us (cancel, suspend). For
        # one with writes the fenced commit finds that out; re-read the claims of the others only.
        unfenced = [wid for wid in notified_owned if wid in self.owned and (wid not in writes or writes[wid].empty)]
        deposed = self._claims_changed(unfenced)
        if deposed:
            busy = True
            for wid in deposed:
                writes.pop(wid, None)
            self._depose(deposed)
        if writes:
            self.claimed_ahead = 0
            deferred = self._commit(list(writes.values()), now, claim_ahead=ahead.due(self, claim))
            busy |= len(deferred) < len(writes) or self.claimed_ahead > 0
            if deferred:  # (after the next batch's writes a claim ahead carried: they are other workflows)
                self._carried.update({wid: writes[wid] for wid in sorted(deferred)})
                self._carry_retry_at = time.monotonic() + CARRY_RETRY
        if self.residency.evict(self):
            self._publish_epochs()
        self._dispatch()
        return busy

    def _workflow_now(self, *, fresh: bool) -> datetime:
        """Workflow time for this pass: a database clock reading serves CLOCK_REUSE seconds."""
        return self.clock.now(fresh=fresh, reuse=CLOCK_REUSE)

    def _quiet(self, claim: bool) -> bool:
        """Whether a pass with no wake-up would find nothing to do (engine/quiet.py)."""
        return quiet(self, claim)

    # -- claiming ------------------------------------------------------------------------------
    def _claim(
        self, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str], force: bool, scan: bool = True
    ) -> bool:
        """Claim what is due (``force``: a wake-up named a workflow we do not hold; ``scan``: a maintenance
        tick) and load it, with the workflows waiting to be reloaded (kept there until the load is done)."""
        later: dict[str, int] = {}  # still ours, their rows held by another transaction: not loaded this pass
        if self._reload:  # not renewed while they waited: load those renewed (ownership.held_to_load)
            wait = not self._reload_skipped  # a row skipped before may stay held: skip it at once now
            renewed, later = ownership.held_to_load(self, self._reload, "claim lost before its reload", wait=wait)
            self._reload, self._reload_skipped = {**renewed, **later}, bool(later)
        claimed = self.claimer.claim(force=force, scan=scan)
        later = {wid: epoch for wid, epoch in later.items() if wid not in claimed}
        for wid in [wid for wid in claimed if wid in self.owned]:  # its claim went away unseen (a missed
            writes.pop(wid, None)  # wake-up) and came back to us: the old context and its writes are stale
            self._drop(wid, reason="claim taken again at a new epoch")
        self.residency.forget(claimed)  # claimed again at a new epoch: an evicted entry of theirs is stale
        claimed.update({wid: epoch for wid, epoch in self._reload.items() if wid not in claimed and wid not in later})
        self._reload = {**later, **claimed}  # until loaded: a load that raises leaves them to a later pass
        if not claimed:
            return False
        # Read by the acquire itself (store/claims/taking.py) or one round trip per chunk (store/histories.py).
        self.loader.load(claimed, now, writes, changed, preloaded=claimed.loaded, preloaded_for=claimed.loaded_for)
        self._reload = later
        self._publish_epochs()
        return True

    def _load_recalled(
        self, renewed: dict[str, int], now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]
    ) -> bool:
        """Load now what this pass's recall just renewed, not a later pass's (residency.recall): its mail is next."""
        recalled = {wid: epoch for wid, epoch in renewed.items() if self._reload.get(wid) == epoch}
        if recalled:
            self.loader.load(recalled, now, writes, changed)  # until loaded they stay in _reload
            self._reload = {wid: epoch for wid, epoch in self._reload.items() if wid not in recalled}
            self._publish_epochs()
        return bool(recalled)

    # -- committing and dispatching ------------------------------------------------------------------
    def _commit(self, batch: list[WorkflowWrites], now: datetime, *, claim_ahead: bool = False) -> set[str]:
        """Fenced-commit these workflows' writes. Returns those deferred (a row it needed was locked
        elsewhere; nothing of theirs written): kept for a later commit, their activities not dispatched.
        ``claim_ahead``: the commit runs on its own thread while the loop claims ahead (engine/ahead.py)."""
        for writes in batch:  # a run that never started a child has none to close at its end
            note_children(self.owned.get(writes.workflow_id), writes)
        now = commit_time(self.owned, batch, now)  # not before a local step of this pass ended
        batch, alone, deferred = self.locked_rows.sort(batch)  # a row a user holds: tried alone, later
        deferred |= {wid for writes in alone for wid in self._commit([writes], now)}
        commit = functools.partial(
            fenced_commit, self.engine_id, batch, now, self.using, self.settings.workflow_claim_ttl
        )
        clash: dict[str, int] = {}  # claimed ahead at a new epoch while in this commit: loaded after it
        failed: list[Exception] = []  # what the claim ahead raised: raised once the commit is handled
        beside = functools.partial(ahead.claim_ahead, self, {w.workflow_id for w in batch}, clash, failed)
        try:
            result = self.commits.run(commit, beside) if claim_ahead else commit()
        except (DatabaseError, UnicodeEncodeError) as exc:  # whose fault, what is kept: engine/containment.py
            with ahead.handling(self, clash, failed):  # then the workflows claimed again (engine/ahead.py)
                deferred |= contain_refused_commit(self, batch, now, exc, self._commit)
            return deferred
        except BaseException:  # the commit's own error goes on (the pass's containment reloads)
            ahead.after(self, clash, [])
            raise
        with ahead.handling(self, clash, failed):  # even if the handling raises (a database error)
            self.locked_rows.forget(result.committed)
            events.committed(self, batch, result)  # after the commit: signals, metrics, status counts
            if result.children:
                self.claimer.scan_soon()  # children were started: look for claimable work on the next tick
            self.refused_commits += len(result.lost)
            if result.lost:
                self._depose(set(result.lost), reason="fenced commit refused")
            for owned in filter(None, map(self.owned.get, result.stale)):  # a step it believed running was settled
                self._refused(owned)
            for writes in batch:
                if writes.workflow_id not in result.committed:
                    continue
                if writes.finish is not None or writes.stuck is not None or writes.continued is not None:
                    self.claimer.slot_freed(writes.finish is not None)
                    ended = self.owned.pop(writes.workflow_id, None)
                    if ended is not None:
                        ended.run.close()
            self._publish_epochs()
        return deferred | {wid for wid in result.busy if wid in self.owned}

    def reload_batch(self, workflow_ids: list[str]) -> None:
        """A commit of theirs failed: drop their contexts and writes, load them again from what is durable."""
        for failed in filter(None, map(self.owned.get, workflow_ids)):
            self._reload[failed.workflow_id] = failed.epoch
            self._drop(failed.workflow_id, reason=None)

    def flush(self, workflow_ids: set[str], now: datetime, writes: dict[str, WorkflowWrites]) -> None:
        """Commit now what these workflows recorded in this pass, before their live state answers a
        query or takes an update: nothing is acknowledged ahead of what it depends on. Writes whose
        commit was deferred stay in ``writes`` (the workflow is then not durable yet: see durable()).

        Args:
            workflow_ids: the workflows to commit.
            now: workflow time of the pass.
            writes: the pass's writes, by workflow id (committed ones are removed).
        """
        batch = []
        for wid in sorted(workflow_ids):
            owned = self.owned.get(wid)
            if owned is None:
                continue
            collect_recorded(owned, writes)
            pending = writes.get(wid)
            if pending is not None and not pending.empty:
                batch.append(writes.pop(wid))
        if not batch:
            return
        deferred = self._commit(batch, now)
        for w in batch:
            if w.workflow_id in deferred:
                writes[w.workflow_id] = w

    def durable(self, workflow_id: str, writes: dict[str, WorkflowWrites]) -> bool:
        """Whether everything this workflow's live state rests on is committed (nothing pending).

        Args:
            workflow_id: the workflow.
            writes: the pass's writes, by workflow id.
        """
        pending = writes.get(workflow_id)
        owned = self.owned.get(workflow_id)
        recorded = owned is not None and bool(owned.run.new_steps or owned.run.responses)
        return (pending is None or pending.empty) and workflow_id not in self._carried and not recorded

    def _dispatch(self) -> None:
        """Hand the attempts queued this pass (and those held back) to the activity threads."""
        queued, self.attention.dispatching = self.attention.dispatching, {}
        for wid in queued:
            owned = self.owned.get(wid)
            if owned is None or not owned.dispatch:
                continue
            if self.stopping.is_set():  # draining: start nothing new (the attempts stay recorded as
                owned.dispatch = []  # running: the next owner runs them under the same attempt numbers)
                continue
            if self.wake.gone(wid, owned.epoch):  # taken over since its commit (a stall, engine/stall.py,
                owned.dispatch = []  # in a claim ahead's code): its new owner runs them; the next pass drops it
                continue
            if wid in self._carried:  # the commit recording these attempts was deferred: dispatch after it
                self.attention.dispatching[wid] = None
                continue
            self.attention.running.add(wid)  # before the submits: one that raises leaves none untracked
            for task in owned.dispatch:
                owned.inflight[task.seq] = task
                self.executor.submit(task)
            owned.dispatch = []

    # -- losing, dropping and reloading workflows --------------------------------------------------------
    def _claims_changed(self, workflow_ids: list[str]) -> set[str]:
        """A wake-up for a workflow we hold may be a transition that deposed us: re-read its claim."""
        if not workflow_ids:
            return set()
        current = histories.claim_holders(workflow_ids, self.using)
        return {wid for wid in workflow_ids if current.get(wid) != (self.owned[wid].epoch, self.engine_id)}

    def _depose(self, workflow_ids: set[str], reason: str = "claim lost") -> None:
        """Stop driving workflows whose claim is gone. A cancelled one runs its on_cancel handlers once,
        in memory (its cancellation is already durable); nothing is written for any of them."""
        cancelled = runs.cancelled_among(list(workflow_ids), self.using)
        for wid in workflow_ids:
            if wid in cancelled:
                self.progress.run_cancel_handlers(wid)
            self._drop(wid, reason="cancelled" if wid in cancelled else reason)

    def _drop(self, wid: str, reason: str | None) -> None:
        self._carried.pop(wid, None)
        self.locked_rows.forget((wid,))  # taken again, it is tried at once, not after the old back-off
        owned = self.owned.pop(wid, None)
        if owned is None:
            return
        if reason:
            logger.warning(_STOPPED_DRIVING, wid, self.engine_id, owned.epoch, reason)
        events.claim_lost(self, owned, reason)
        # A reload (reason None) lets atomic attempts go on, fenced (stopped, one past SQLite's busy timeout re-ran)
        for task in [t for t in owned.inflight.values() if reason or not t.definition.atomic]:
            task.control.request_stop(reason or "the engine reloads the workflow")
        owned.run.close()
        self._publish_epochs()

    def _refused(self, owned: Owned) -> None:
        """An atomic attempt's commit disagrees with this context (refused, or settled a step): reload at the
        same epoch; no claim_lost (a claim that did move on is reported by the renewal or the next commit)."""
        self.refused_commits, self._reload[owned.workflow_id] = self.refused_commits + 1, owned.epoch
        logger.warning("reloading workflow=%s engine=%s: atomic commit disagrees", owned.workflow_id, self.engine_id)
        self._drop(owned.workflow_id, reason=None)

    def reload_all(self) -> None:
        """After a pass failed: drop every owned workflow and nothing carried; reload them all from the log."""
        self._reload.update({wid: o.epoch for wid, o in self.owned.items()})
        self._carried = {}  # nothing of them is durable: the reload replays from what is
        self._drop_all(None)

    def _drop_all(self, reason: str | None) -> None:
        for wid in list(self.owned):
            self._drop(wid, reason)

    def commit_stuck(self, wid: str, error: WeftError) -> None:
        """Make owned ``wid`` stuck with ``error`` in a commit of its own, stop driving it (containment of a bug)."""
        owned = self.owned[wid]
        writes: dict[str, WorkflowWrites] = {}
        try:
            now = db_now(self.using)
            mark_stuck(self.engine_id, wid, owned.run_id, owned.epoch, owned.stuck_attempts, error, now, writes)
            self._commit(list(writes.values()), now)
        except Exception:
            logger.exception("could not record workflow=%s as stuck engine=%s", wid, self.engine_id)
            connections[self.using].close()
        self._drop(wid, reason=None)

    def answer_query(self, workflow_id: str, name: str, *args: Any) -> Any:
        """Answer a query from this engine's live context (``Progress.answer_query``).

        Raises:
            WorkflowNotLocallyOwnedError: this engine does not drive the workflow.
            QueryNotFoundError: the workflow has no such query.
        """
        return self.progress.answer_query(workflow_id, name, *args)

    def _publish_epochs(self) -> None:
        self.renewal.publish(self.owned, self.residency.evicted)  # the live dicts: no copy per pass
