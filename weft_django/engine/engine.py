"""Engine: start-up gates, the loop, shutdown. No argparse, no Django command: runnable from tests.

One thread drives generators; a thread pool runs activities; renewal has its own thread and
connection; on PostgreSQL a listener thread turns NOTIFY into wake-ups. Per wake the loop claims new
work, settles finished activities, fires due timers of owned workflows, delivers signals, advances
generators, and commits every workflow's resulting writes in one fenced commit. Activities are
dispatched only after the commit that recorded their attempt (the ordering rule).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, close_old_connections, connections
from django.db.models import Q

from .. import events
from ..clock import db_now, offset_generation
from ..conf import WeftSettings, get_settings
from ..context import WorkflowContext
from ..exceptions import (
    EngineLeaseAcquisitionTimeoutError,
    QueryNotFoundError,
    VersionMismatchError,
    WeftError,
    WorkflowNotLocallyOwnedError,
    WorkflowNotRegisteredError,
)
from ..models import BufferedSignal, Timer, Workflow, WorkflowClaim
from ..operations import StartChild, WaitForSignal
from ..registry import registry
from ..status import OwnershipMode, TimerKind, WorkflowStatus
from . import ownership, sessions
from .containment import contain_tick_failure, internal_error, load_each
from .driver import AppliedRecord, StepRecord, WorkflowRun
from .executors import ActivityExecutors
from .fencing import WorkflowWrites, fenced_commit
from .messages import _state as mailbox_state
from .messages import deliver_messages, prefetch_admitted
from .periodic import builtin_tasks
from .progress import Owned, Progress, RunRow, load, mailbox_of
from .timers import TimerHeap
from .wakeups import Listener

logger = logging.getLogger(__name__)
STUCK_MAX_BACKOFF = timedelta(minutes=5)
MAINTENANCE_DEFER = 3  # poll intervals a stream of wake-ups may hold back the maintenance scans
CLOCK_REUSE = 0.5  # seconds a database clock reading serves the passes that follow (PostgreSQL)
ESTIMATE_JITTER = timedelta(milliseconds=5)  # how far a fresh reading may fall behind the last estimate
CARRY_RETRY = 0.05  # seconds before a commit deferred by a locked row is tried again (when nothing else wakes us)


class Engine(Progress):
    def __init__(
        self,
        engine_id: str | None = None,
        *,
        concurrency: int | None = None,
        settings: WeftSettings | None = None,
        drain_timeout: float = 10.0,
    ) -> None:
        self.settings = settings or get_settings()
        self.using = self.settings.database
        self.engine_id = engine_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.concurrency = concurrency or self.settings.activity_concurrency
        self.drain_timeout = drain_timeout
        self.owned: dict[str, Owned] = {}
        self.timers = TimerHeap()
        self.stopping = threading.Event()
        self._threads_stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._notified: set[str] = set()
        self._rescan = True
        self._lost: set[str] = set()
        self._epochs: dict[str, int] = {}  # snapshot for the renewal thread
        self._reload: dict[str, int] = {}
        # Writes a fenced commit deferred because another transaction held a row it needed (a user's
        # open transaction around cancel(), say): they open the next pass's writes, so what that pass
        # adds for the same workflow commits with them, never ahead of them.
        self._carried: dict[str, WorkflowWrites] = {}
        self._carry_retry_at = 0.0
        self._last_claim_scan = 0.0
        self._last_takeover_scan = 0.0
        self._last_maintenance = 0.0
        self._last_mailbox_sweep = 0.0
        self._clock: tuple[datetime, float] | None = None  # the last db_now() and time.monotonic() then
        self._clock_generation = -1  # clock.offset_generation() at that reading
        self._last_now = datetime.min.replace(tzinfo=UTC)  # the latest workflow time a pass was given
        self.refused_commits = 0
        self.mode = self.settings.ownership
        self._lease_epoch: int | None = None
        self._lease_lost = False
        self._take_over_now = False
        self._warned_engines: set[str] = set()
        self.periodic = builtin_tasks()
        self._queries_waiting = True  # a "q:<engine id>" wake-up: query requests addressed to us
        self._session_limit = sessions.session_limit(self.settings)  # a frozen engine's locks end then
        commit_atomic = sessions.bounded_commit(self._commit_atomic_step, self.using, self._session_limit)
        self.executor = ActivityExecutors(
            self.engine_id, self.concurrency, self._wake.set, commit_atomic, self.using, self.settings
        )
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        sessions.bind(self.using, self._session_limit)  # the loop's thread; unbound in shutdown()
        ownership.check_mode_marker(self.engine_id, self.settings.ownership, self.using)
        ownership.register_engine(self.engine_id, self.settings.ownership, self.using)
        grace = self.settings.workflow_claim_renew_interval * ownership.TAKEOVER_GRACE_MULTIPLIER
        events.claims_left_by_previous_process(self, grace)  # issue 20: a restart after kill -9 says why it waits
        if self.mode == OwnershipMode.LEASE:
            self._wait_for_store_lease()
        elif self.mode == OwnershipMode.NONE:
            self._take_over_now = True  # the single engine: its predecessor's claims are taken at once
        renewer = threading.Thread(target=self._renew_loop, name="weft-renew", daemon=True)
        self._threads.append(renewer)
        if connections[self.using].vendor == "postgresql":
            self._threads.append(Listener(self.using, self._on_notify, self._threads_stop))
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
        and stopped around it."""
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
        self.stopping.set()
        self._wake.set()

    def idle(self) -> bool:
        # An activity waiting out its retry back-off is still being processed, not parked.
        if (
            self._carried
            or self._reload
            or self.executor.running
            or any(
                o.inflight or o.dispatch or any(kind == TimerKind.ACTIVITY_RETRY for kind, _ in o.timers)
                for o in self.owned.values()
            )
        ):
            return False
        next_fire = self.timers.next_fire_at()
        if next_fire is not None and next_fire <= db_now(self.using):
            return False
        return not self._claimable() and not self._deliverable()

    def _deliverable(self) -> bool:
        """Whether a buffered signal (or child-terminal record) waits for a workflow parked here."""
        waiting = {
            wid: {
                mailbox_of(leaf)
                for leaf in owned.run.pending_leaves()
                if isinstance(leaf.op, WaitForSignal | StartChild)
            }
            for wid, owned in self.owned.items()
        }
        names = {name for wanted in waiting.values() for name in wanted}
        if not names:
            return False
        rows = (
            BufferedSignal.objects.using(self.using)
            .filter(
                workflow_id__in=[wid for wid, wanted in waiting.items() if wanted], state="buffered", name__in=names
            )
            .values_list("workflow_id", "name")
        )
        return any(name in waiting[wid] for wid, name in rows)

    # -- the store-wide lease ("lease" mode) ---------------------------------------------------------
    def _wait_for_store_lease(self) -> None:
        """Block until this engine holds the store lease, or raise after LEASE_WAIT_TIMEOUT."""
        deadline = time.monotonic() + self.settings.lease_wait_timeout.total_seconds()
        while True:
            if self._try_store_lease() or self.stopping.is_set():
                return
            if time.monotonic() >= deadline:
                ownership.stop_engine(self.engine_id, self.using)
                raise EngineLeaseAcquisitionTimeoutError(
                    f"Engine {self.engine_id!r} could not acquire the store-wide lease within "
                    f"{self.settings.lease_wait_timeout} (OWNERSHIP='lease' allows one engine at a time; another "
                    f"engine holds it). Stop the other engine, raise LEASE_WAIT_TIMEOUT, or use "
                    f"OWNERSHIP='workflow-lease' to run several engines."
                )
            time.sleep(min(self.settings.lease_renew_interval.total_seconds(), 1.0))

    def _try_store_lease(self) -> bool:
        epoch = ownership.acquire_store_lease(
            self.engine_id,
            ttl=self.settings.lease_ttl,
            renew_interval=self.settings.lease_renew_interval,
            using=self.using,
        )
        if epoch is None:
            return False
        logger.info("store lease acquired engine=%s epoch=%s", self.engine_id, epoch)
        self._lease_epoch, self._lease_lost, self._take_over_now = epoch, False, True
        return True

    def _check_store_lease(self) -> bool:
        """In "lease" mode: losing the lease deposes this engine for every workflow at once. Returns
        whether this engine may drive workflows now."""
        if self.mode != OwnershipMode.LEASE:
            return True
        if self._lease_lost:
            logger.warning("store lease lost engine=%s: deposed for every workflow", self.engine_id)
            for wid in list(self.owned):
                self._drop(wid, reason="store lease lost")
            self._lease_epoch, self._lease_lost = None, False
        if self._lease_epoch is None:
            return self._try_store_lease()
        return True

    def _detect_second_instance(self) -> None:
        if not self.settings.detect_second_instance or self.mode == OwnershipMode.WORKFLOW_LEASE:
            return
        others = ownership.other_live_engines(self.engine_id, within=self.settings.workflow_claim_ttl, using=self.using)
        for other in set(others) - self._warned_engines:
            logger.warning(
                "second engine instance detected engine=%s other=%s mode=%s: OWNERSHIP=%r assumes one engine; "
                "use 'workflow-lease' to run several",
                self.engine_id,
                other,
                self.mode,
                self.mode,
            )
        self._warned_engines |= set(others)

    def shutdown(self) -> None:
        self._threads_stop.set()
        self.executor.shutdown(0)
        try:
            ownership.release(self.engine_id, {wid: o.epoch for wid, o in self.owned.items()}, self.using)
            events.claims_released(self, len(self.owned))
            if self._lease_epoch is not None:
                ownership.release_store_lease(self.engine_id, self._lease_epoch, self.using)
            ownership.stop_engine(self.engine_id, self.using)
        except DatabaseError:
            logger.exception("could not release claims at shutdown engine=%s", self.engine_id)
        for owned in self.owned.values():
            owned.run.close()
        self.owned.clear()
        self._publish_epochs()
        for thread in self._threads:
            thread.join(timeout=2)
        sessions.unbind(self.using)
        logger.info("engine stopped engine=%s", self.engine_id)

    def _drain(self) -> None:
        """Let running activities finish for at most drain_timeout and commit their results."""
        deadline = time.monotonic() + self.drain_timeout
        while (self.executor.running or self._carried) and time.monotonic() < deadline:
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
        self._wake.wait(timeout)
        self._wake.clear()

    def _on_notify(self, payload: str | None) -> None:
        with self._lock:
            if payload is None or payload.endswith(":*"):
                self._rescan = True
            elif payload.startswith("w:"):
                self._notified.add(payload[2:])
            elif payload == f"q:{self.engine_id}":
                self._queries_waiting = True
            else:
                return
        self._wake.set()

    # -- the tick ----------------------------------------------------------------------------
    def tick(self, *, claim: bool = True) -> bool:
        """One pass of the loop. Returns whether anything happened."""
        # The loop keeps its connection across ticks (reconnecting per tick would cost a backend fork
        # under CONN_MAX_AGE=0); it is closed after a database error, so the next tick reconnects.
        try:
            return self._tick(claim)
        except DatabaseError:
            connections[self.using].close()
            logger.exception("database error in tick engine=%s; retrying", self.engine_id)
            self._reload.update({wid: o.epoch for wid, o in self.owned.items()})
            self._carried = {}  # nothing of them is durable: the reload replays from what is
            for owned in list(self.owned.values()):
                self._drop(owned.workflow_id, reason=None)
            time.sleep(0.2)
            return False
        except Exception as exc:  # one workflow's handling failed: stick it, not the engine (containment.py)
            return contain_tick_failure(self, exc)

    def _tick(self, claim: bool) -> bool:
        with self._lock:
            lost, self._lost = self._lost, set()
            notified, self._notified = self._notified, set()
            rescan, self._rescan = self._rescan, False
        if not (lost or notified or rescan) and self._quiet(claim):
            return False
        now = self._workflow_now(fresh=rescan)
        busy = False
        notified_owned = [wid for wid in notified if wid in self.owned]
        if lost:
            busy = True
            self._depose(lost)
        # Writes deferred by the last pass come first: this pass's writes for the same workflow join them.
        writes: dict[str, WorkflowWrites] = {wid: w for wid, w in self._carried.items() if wid in self.owned}
        self._carried = {}
        changed: set[str] = set()

        self.executor.poll(notified)  # outcomes remote workers committed (Celery)
        for outcome in self._drain_outcomes():
            busy = True
            self._on_outcome(outcome, now, writes, changed)
        self._expire_attempts(now, writes, changed)
        for wid, kind, seq in self.timers.pop_due(now):
            busy = True
            self._on_timer(wid, kind, seq, now, writes, changed)

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
        sweep = poll_due and self._mailbox_sweep_due()
        signal_check = {wid for wid in self.owned if sweep or wid in notified or rescan}
        if signal_check:
            busy |= self._deliver_signals(signal_check, now, writes, changed)

        message_check = {wid for wid in self.owned if sweep or wid in notified or rescan}
        queries, self._queries_waiting = self._queries_waiting or poll_due or rescan, False
        busy |= deliver_messages(self, message_check, queries, now, writes, changed)

        if claim and not self.stopping.is_set() and self._check_store_lease():
            unknown = {wid for wid in notified if wid not in self.owned}
            busy |= self._claim(now, writes, changed, force=bool(unknown) or rescan, scan=poll_due)
            for task in self.periodic if poll_due else ():
                if self._wake.is_set() and not overdue:
                    break  # a wake-up arrived: serve it first, the rest stay due for the next tick
                if task.due(self):
                    task.last_run = time.monotonic()
                    busy |= task.run(self, now)

        for _ in range(1000):  # settle cascades (memo, wait_until, consumed signals) within this tick
            if not changed:
                break
            pending, changed = changed, set()
            for wid in pending:
                self._advance_effects(wid, now, writes, changed)
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
            deferred = self._commit(list(writes.values()), now)
            busy |= len(deferred) < len(writes)
            if deferred:
                self._carried = {wid: writes[wid] for wid in sorted(deferred)}
                self._carry_retry_at = time.monotonic() + CARRY_RETRY
        self._dispatch()
        return busy

    def _workflow_now(self, *, fresh: bool) -> datetime:
        """Workflow time for this pass. On PostgreSQL the database clock is read at most once per
        CLOCK_REUSE while passes follow each other (every activity outcome is a pass); in between it
        is the last reading plus the monotonic time since, as the quiet-pass check already judges
        deadlines (the two clocks drift by microseconds per second). A test's clock offset change
        (clock.set_offset: a new generation here, a ":*" wake-up elsewhere) forces a reading."""
        clock = time.monotonic()
        last = self._clock
        if (
            not fresh
            and last is not None
            and clock - last[1] < CLOCK_REUSE
            and self._clock_generation == offset_generation()
            and connections[self.using].vendor == "postgresql"
        ):
            self._last_now = max(self._last_now, last[0] + timedelta(seconds=clock - last[1]))
            return self._last_now
        generation = offset_generation()
        now = db_now(self.using)
        # Counted from the reply's arrival: an estimate can only lag the database clock (by the reply's
        # way back), so a timer or deadline never comes due early.
        self._clock, self._clock_generation = (now, time.monotonic()), generation
        if timedelta(0) < self._last_now - now < ESTIMATE_JITTER:
            now = self._last_now  # not behind an estimate already handed out (a moved offset is more)
        self._last_now = now
        return now

    def _mailbox_sweep_due(self) -> bool:
        """Whether this maintenance pass reads the signals and updates of EVERY owned workflow. Without
        LISTEN (SQLite) that is how they are found: every POLL_INTERVAL. With LISTEN every signal and
        update comes with a wake-up naming its workflow, and a lost listener connection triggers a full
        rescan, so the sweep is only a safety net: once per renew interval, not per POLL_INTERVAL (with
        10,000 parked workflows the per-poll sweep was most of an idle engine's CPU)."""
        clock = time.monotonic()
        if connections[self.using].vendor == "postgresql":
            every = max(self.settings.poll_interval, self.settings.workflow_claim_renew_interval).total_seconds()
            if clock - self._last_mailbox_sweep < every:
                return False
        self._last_mailbox_sweep = clock
        return True

    def _quiet(self, claim: bool) -> bool:
        """Whether a pass with no wake-up would find nothing to do: no outcome, no scan due, no timer
        or attempt deadline near, no mailbox to look at. Such a pass (as after every commit) skips
        even its clock read; deadlines are judged by the last database clock reading plus the local
        time since, and a reading is never carried forward more than CLOCK_REUSE (see _workflow_now)."""
        clock = time.monotonic()
        poll = self.settings.poll_interval.total_seconds()
        if (
            self._clock is None
            or clock - self._last_maintenance >= poll
            or self._last_claim_scan == 0.0
            or self._reload
            or self._take_over_now
            or self._queries_waiting
            or self._lease_lost
            or (self.mode == OwnershipMode.LEASE and self._lease_epoch is None)
            or not self.executor.outcomes.empty()
            or self.executor._celery is not None  # remote outcomes are found by polling
            or (self._carried and clock >= self._carry_retry_at)
        ):
            return False
        renew = self.settings.workflow_claim_renew_interval.total_seconds()
        takeover_every = poll if self.mode == OwnershipMode.LEASE else renew
        if claim and clock - self._last_takeover_scan >= takeover_every:
            return False
        for owned in self.owned.values():
            if any(task.deadline is not None and clock >= task.deadline for task in owned.inflight.values()):
                return False
        next_fire = self.timers.next_fire_at()
        estimate = self._clock[0] + timedelta(seconds=clock - self._clock[1] + 0.01)
        if next_fire is not None and next_fire <= estimate:
            return False
        mailboxes = mailbox_state(self)  # deliver_messages looks at new contexts and moved frontiers
        if any(mailboxes.checked.get(wid) is not owned for wid, owned in self.owned.items()):
            return False
        for wid, seq in mailboxes.parked.items():
            parked = self.owned.get(wid)
            if parked is None or (parked.run.frontier is not None and parked.run.frontier.seq != seq):
                return False
        return True

    # -- claiming and loading ------------------------------------------------------------------
    def _claimable(self) -> bool:
        now = db_now(self.using)
        runnable = Workflow.objects.using(self.using).filter(
            Q(stuck_retry_at__isnull=True) | Q(stuck_retry_at__lte=now),
            status=WorkflowStatus.RUNNING,
            id__in=_unheld_claims(self.using),
        )
        due_starts = Timer.objects.using(self.using).filter(kind=TimerKind.DELAYED_START, fire_at__lte=now)
        return runnable.exists() or due_starts.exists()

    def _capacity(self) -> int:
        return self.settings.claim_batch_size

    def _claim(
        self, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str], force: bool, scan: bool = True
    ) -> bool:
        """``force``: a wake-up named a workflow we do not hold (acquire now); ``scan``: a maintenance
        tick (acquire if POLL_INTERVAL passed, fire due delayed starts)."""
        poll = self.settings.poll_interval.total_seconds()
        clock = time.monotonic()
        claimed: dict[str, int] = {}
        requested = self._last_claim_scan == 0.0  # a full batch or new children: look again now
        scan_due = requested or (scan and clock - self._last_claim_scan >= poll)
        if force or scan_due:
            self._last_claim_scan = clock
            got = ownership.acquire(
                self.engine_id,
                limit=self._capacity(),
                ttl=self.settings.workflow_claim_ttl,
                renew_interval=self.settings.workflow_claim_renew_interval,
                using=self.using,
            )
            events.claims_acquired(self.engine_id, got, self.using)
            claimed.update({wid: epoch for wid, (epoch, _) in got.items()})
            if len(got) >= self._capacity():
                self._last_claim_scan = 0.0  # a full batch: more may be waiting, scan again next tick
            if scan_due:  # delayed starts send no wake-up: found by the scan alone
                claimed.update(
                    ownership.fire_delayed_starts(
                        self.engine_id,
                        limit=self._capacity(),
                        ttl=self.settings.workflow_claim_ttl,
                        using=self.using,
                    )
                )
        if self._take_over_now or (self.mode == OwnershipMode.LEASE and clock - self._last_takeover_scan >= poll):
            got = ownership.take_over_from_others(
                self.engine_id, limit=self._capacity(), ttl=self.settings.workflow_claim_ttl, using=self.using
            )
            self._take_over_now = len(got) >= self._capacity()  # more left: take them on the next pass
            for wid, (epoch, previous) in got.items():
                logger.warning(
                    "took over workflow=%s engine=%s epoch=%s previous=%s mode=%s",
                    wid,
                    self.engine_id,
                    epoch,
                    previous,
                    self.mode,
                )
                events.claim_taken_over(self, wid, epoch, previous)
            claimed.update({wid: epoch for wid, (epoch, _) in got.items()})
        if clock - self._last_takeover_scan >= self.settings.workflow_claim_renew_interval.total_seconds():
            self._last_takeover_scan = clock
            self._detect_second_instance()
            got = ownership.acquire(
                self.engine_id,
                limit=self._capacity(),
                ttl=self.settings.workflow_claim_ttl,
                renew_interval=self.settings.workflow_claim_renew_interval,
                using=self.using,
                takeover=True,
            )
            for wid, (epoch, previous) in got.items():
                logger.warning(
                    "took over workflow=%s engine=%s epoch=%s previous=%s", wid, self.engine_id, epoch, previous
                )
                events.claim_taken_over(self, wid, epoch, previous)
            claimed.update({wid: epoch for wid, (epoch, _) in got.items()})
            if len(got) >= self._capacity():
                self._last_takeover_scan = 0.0  # a full pass: start the next one at once
        reload, self._reload = self._reload, {}
        claimed.update({wid: epoch for wid, epoch in reload.items() if wid not in claimed})
        if not claimed:
            return False
        self._load(claimed, now, writes, changed)
        return True

    def _load(
        self, claimed: dict[str, int], now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]
    ) -> None:
        # Runs, steps, applied updates, timers (and on PostgreSQL the admitted updates, for the first
        # mailbox look): one round trip per chunk of ids on PostgreSQL (engine/progress.py).
        unreadable: set[str] = set()  # made stuck in ``writes``: that commit releases their claims
        try:
            loaded = load(list(claimed), self.using)
        except DatabaseError:
            raise
        except Exception as exc:  # a row the loader cannot convert: only its workflow is left out
            loaded, unreadable = load_each(self, claimed, now, writes, exc)
        release: dict[str, int] = {}
        for wid, epoch in claimed.items():
            row = loaded.runs.get(wid)
            if row is None or row.status != WorkflowStatus.RUNNING:
                if wid not in unreadable:
                    release[wid] = epoch
                continue
            run_id = str(row.run_id)
            steps, timers, applied = loaded.steps[run_id], loaded.timers.get(wid, []), loaded.applied.get(run_id)
            try:
                owned = self._start_run(row, epoch, steps, timers, now, writes, applied)
            except Exception as exc:  # a bug handling this one workflow: it gets stuck, the batch goes on
                logger.exception("starting workflow=%s failed engine=%s", wid, self.engine_id)
                self._drop(wid, reason=None)
                writes.pop(wid, None)
                self._stuck(wid, run_id, epoch, row.stuck_attempts, internal_error(wid, exc), now, writes)
                continue
            if owned is not None:
                changed.add(wid)
                if loaded.admitted is not None:
                    prefetch_admitted(self, owned, loaded.admitted.get(wid, []))
        if release:
            ownership.release(self.engine_id, release, self.using)
        self._publish_epochs()

    def _start_run(
        self,
        row: RunRow,
        epoch: int,
        steps: dict[int, StepRecord],
        timers: list[Timer],
        now: datetime,
        writes: dict[str, WorkflowWrites],
        applied: list[AppliedRecord] | None = None,
    ) -> Owned | None:
        ctx = WorkflowContext(
            workflow_id=row.id,
            run_id=str(row.run_id),
            workflow_type=row.workflow_type,
            started_at=row.started_at,
            epoch=epoch,
        )
        try:
            definition = registry.workflow(row.workflow_type, row.version)
        except WorkflowNotRegisteredError as exc:
            error: WeftError = exc
            if row.workflow_type in registry.latest:
                error = VersionMismatchError(
                    f"Workflow {row.id!r} runs {row.workflow_type!r} version {row.version!r}, but this engine "
                    f"has version {registry.latest[row.workflow_type].version!r}. Deploy code that registers "
                    f"version {row.version!r} (keep the old version registered next to the new one)."
                )
            self._stuck(row.id, str(row.run_id), epoch, row.stuck_attempts, error, now, writes)
            return None
        run = WorkflowRun(definition, ctx, row.input, steps, applied)
        owned = Owned(
            row.id,
            str(row.run_id),
            epoch,
            run,
            stuck_attempts=row.stuck_attempts,
            parent=(row.parent_id, str(row.parent_run_id), row.parent_seq)
            if row.parent_id and row.parent_seq is not None
            else None,
            depth=row.depth,
            clear_stuck=row.stuck_error is not None,
        )
        self.owned[row.id] = owned
        for timer in timers:
            owned.timers[(timer.kind, timer.seq or 0)] = timer
            self.timers.push(timer.fire_at, row.id, timer.kind, timer.seq or 0)
        if row.execution_deadline is not None:
            self.timers.push(row.execution_deadline, row.id, TimerKind.EXECUTION_DEADLINE, -1)
        run.start()
        self._restore_wait_starts(owned, row.started_at)  # a wait's step records when it really began
        if owned.clear_stuck:
            self._writes(owned, writes).clear_stuck = True
        return owned

    def _stuck(
        self,
        wid: str,
        run_id: str,
        epoch: int,
        attempts: int,
        error: WeftError,
        now: datetime,
        writes: dict[str, WorkflowWrites],
    ) -> None:
        backoff = min(timedelta(seconds=2 ** min(attempts, 12)), STUCK_MAX_BACKOFF)
        logger.error(
            "workflow stuck workflow=%s engine=%s epoch=%s error=%s retry_in=%s",
            wid,
            self.engine_id,
            epoch,
            error,
            backoff,
        )
        w = writes.setdefault(wid, WorkflowWrites(wid, run_id, epoch))
        w.stuck = {
            "error": {"type": type(error).__name__, "message": str(error)},
            "retry_at": now + backoff,
            "attempts": attempts + 1,
        }

    # -- committing and dispatching ------------------------------------------------------------------
    def _commit(self, batch: list[WorkflowWrites], now: datetime) -> set[str]:
        """Fenced-commit these workflows' writes. Returns the workflows whose commit was deferred (a
        row it needed was locked by another transaction; nothing of theirs was written): the caller
        keeps their writes for a later commit, and their activities are not dispatched until then."""
        try:
            result = fenced_commit(self.engine_id, batch, now, self.using, self.settings.workflow_claim_ttl)
        except DatabaseError:
            logger.exception("fenced commit failed engine=%s; reloading its workflows", self.engine_id)
            for writes in batch:
                owned = self.owned.get(writes.workflow_id)
                if owned is not None:
                    self._reload[owned.workflow_id] = owned.epoch
                    self._drop(owned.workflow_id, reason=None)
            return set()
        events.committed(self, batch, result)  # after the commit: signals, metrics, status counts
        if result.children:
            self._last_claim_scan = 0.0  # children were started: look for claimable work on the next tick
        self.refused_commits += len(result.lost)
        if result.lost:
            self._depose(set(result.lost), reason="fenced commit refused")
        for writes in batch:
            if writes.workflow_id not in result.committed:
                continue
            if writes.finish is not None or writes.stuck is not None:
                owned = self.owned.pop(writes.workflow_id, None)
                if owned is not None:
                    owned.run.close()
        self._publish_epochs()
        return {wid for wid in result.busy if wid in self.owned}

    def flush(self, workflow_ids: set[str], now: datetime, writes: dict[str, WorkflowWrites]) -> None:
        """Commit now what these workflows recorded in this pass, before their live state answers a
        query or takes an update: nothing is acknowledged ahead of what it depends on. Writes whose
        commit was deferred stay in ``writes`` (the workflow is then not durable yet: see durable())."""
        batch = []
        for wid in sorted(workflow_ids):
            owned = self.owned.get(wid)
            if owned is None:
                continue
            self._collect_recorded(owned, writes)
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
        """Whether everything this workflow's live state rests on is committed (nothing pending)."""
        pending = writes.get(workflow_id)
        owned = self.owned.get(workflow_id)
        recorded = owned is not None and bool(owned.run.new_steps or owned.run.responses)
        return (pending is None or pending.empty) and workflow_id not in self._carried and not recorded

    def _dispatch(self) -> None:
        if self.stopping.is_set():
            # Draining: start nothing new. The attempts stay recorded as running, so the next owner
            # runs them under the same attempt numbers.
            for owned in self.owned.values():
                owned.dispatch = []
            return
        for owned in self.owned.values():
            if owned.workflow_id in self._carried:
                continue  # the commit recording these attempts was deferred: dispatch after it
            for task in owned.dispatch:
                owned.inflight[task.seq] = task
                self.executor.submit(task)
            owned.dispatch = []

    def _claims_changed(self, workflow_ids: list[str]) -> set[str]:
        """A wake-up for a workflow we hold may be a transition that deposed us: re-read its claim."""
        if not workflow_ids:
            return set()
        current = {
            wid: (epoch, holder)
            for wid, epoch, holder in WorkflowClaim.objects.using(self.using)
            .filter(workflow_id__in=workflow_ids)
            .values_list("workflow_id", "epoch", "engine_id")
        }
        return {wid for wid in workflow_ids if current.get(wid) != (self.owned[wid].epoch, self.engine_id)}

    def _depose(self, workflow_ids: set[str], reason: str = "claim lost") -> None:
        """Stop driving workflows whose claim is gone. A cancelled one runs its on_cancel handlers once,
        in memory (its cancellation is already durable); nothing is written for any of them."""
        cancelled = set(
            Workflow.objects.using(self.using)
            .filter(id__in=list(workflow_ids), status=WorkflowStatus.CANCELLED)
            .values_list("id", flat=True)
        )
        for wid in workflow_ids:
            owned = self.owned.get(wid)
            if owned is not None and wid in cancelled:
                for handler in owned.run.ctx.cancel_handlers:
                    try:
                        handler()
                    except Exception:
                        logger.exception("on_cancel handler failed workflow=%s engine=%s", wid, self.engine_id)
            self._drop(wid, reason="cancelled" if wid in cancelled else reason)

    def _drop(self, wid: str, reason: str | None) -> None:
        self._carried.pop(wid, None)
        owned = self.owned.pop(wid, None)
        if owned is None:
            return
        if reason:
            logger.warning(
                "stopped driving workflow=%s engine=%s epoch=%s reason=%s", wid, self.engine_id, owned.epoch, reason
            )
        events.claim_lost(self, owned, reason)
        for task in owned.inflight.values():
            task.control.request_stop(reason or "the engine reloads the workflow")
        owned.run.close()
        self._publish_epochs()

    # -- queries (in process; routing from other processes comes with the messages issue) ---------
    def answer_query(self, workflow_id: str, name: str, *args: Any) -> Any:
        """Answer a query from this engine's live context: the built-in ``activity_progress`` first
        (latest heartbeat details of the running activity), then a query handler, then an exposed accessor."""
        owned = self.owned.get(workflow_id)
        if owned is None:
            raise WorkflowNotLocallyOwnedError(
                f"Workflow {workflow_id!r} is not driven by engine {self.engine_id!r}; "
                "ask the engine that holds its claim."
            )
        if name == "activity_progress":
            running = sorted(owned.inflight.values(), key=lambda task: task.seq)
            return running[-1].control.details if running else None
        ctx = owned.run.ctx
        handler = ctx.query_handlers.get(name) or ctx.exposed.get(name)
        if handler is None:
            raise QueryNotFoundError(f"Workflow {workflow_id!r} has no query {name!r}; register it with ctx.on_query.")
        return handler(*args)

    # -- renewal -----------------------------------------------------------------------------------
    def _publish_epochs(self) -> None:
        with self._lock:
            self._epochs = {wid: o.epoch for wid, o in self.owned.items()}

    def _renew_loop(self) -> None:
        interval = self.settings.workflow_claim_renew_interval.total_seconds()
        sessions.bind(self.using, self._session_limit)
        try:
            while not self._threads_stop.wait(interval):
                with self._lock:
                    epochs = dict(self._epochs)
                try:
                    lease_epoch = self._lease_epoch
                    if lease_epoch is not None and not ownership.renew_store_lease(
                        self.engine_id, lease_epoch, ttl=self.settings.lease_ttl, using=self.using
                    ):
                        self._lease_lost = True
                        self._wake.set()
                    lost = ownership.renew(self.engine_id, epochs, self.settings.workflow_claim_ttl, self.using)
                    ownership.heartbeat_engine(self.engine_id, self.using)
                except DatabaseError as exc:  # a storage error is not a loss: try again next tick
                    events.renewal_failed(self, exc)
                    logger.warning("claim renewal failed engine=%s error=%s", self.engine_id, exc)
                    close_old_connections()
                    continue
                if lost:
                    with self._lock:
                        self._lost |= lost
                    self._wake.set()
        finally:
            connections.close_all()


def _unheld_claims(using: str) -> Any:
    from ..models import WorkflowClaim

    # runnable: the partial index weft_claim_free holds exactly these rows (no finished runs).
    return WorkflowClaim.objects.using(using).filter(engine_id__isnull=True, runnable=True).values("workflow_id")


def _parent_of(row: Workflow) -> tuple[str, str, int] | None:
    if row.parent_id and row.parent_seq is not None:
        return (row.parent_id, str(row.parent_run_id), row.parent_seq)
    return None
