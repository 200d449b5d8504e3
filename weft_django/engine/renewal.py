"""Renewal: its own thread and connection, renewing the claims the loop holds (and in "lease" mode
the store-wide lease), heartbeating the engine row, and reporting lost claims to the loop. Also the
store-wide lease itself (``StoreLease``): acquired by the loop, renewed here."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Protocol

from django.db import DatabaseError, close_old_connections, connections

from ..conf import WeftSettings
from ..exceptions import EngineLeaseAcquisitionTimeoutError
from ..status import OwnershipMode
from ..store import claims, engines
from ..store import sessions as store_sessions
from ..store.claims.renewal import RENEW_CHUNK, RenewalPass
from . import ownership
from .stall import LoopWatch
from .wake import Wake

logger = logging.getLogger("weft_django.engine.engine")


class Held(Protocol):
    """A live context as renewal reads it: its claim's epoch (engine/owned.py's Owned)."""

    epoch: int


class StoreLease:
    """The store-wide lease of OWNERSHIP="lease": one engine drives every workflow.

    Args:
        engine_id: this engine.
        settings: the engine's settings (lease TTL, renew interval, wait timeout).
        using: the connection alias.
    """

    def __init__(self, engine_id: str, settings: WeftSettings, using: str) -> None:
        self.engine_id = engine_id
        self.settings = settings
        self.using = using
        self.epoch: int | None = None  # held at this epoch; None: not held
        self.lost = False  # renewal found it gone: the loop deposes this engine for every workflow
        # Orders the renewal thread's ``lost`` after the loop's changes of epoch: a renewal that read an
        # epoch the loop has given up (and taken the lease again since) does not report the new one lost.
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        """Try to take the lease now. Returns whether this engine holds it."""
        epoch = ownership.acquire_store_lease(
            self.engine_id,
            ttl=self.settings.lease_ttl,
            renew_interval=self.settings.lease_renew_interval,
            using=self.using,
        )
        if epoch is None:
            return False
        logger.info("store lease acquired engine=%s epoch=%s", self.engine_id, epoch)
        with self._lock:
            self.epoch, self.lost = epoch, False
        return True

    def wait(self, stopping: threading.Event) -> bool:
        """Block until this engine holds the lease (True) or ``stopping`` is set (False), heartbeating
        the engine row meanwhile: the renewal thread, its heartbeat's writer, starts only once the lease
        is held, and a standby waiting longer than the claim TTL is alive, not dead (admin, doctor). A
        database error (a connection cut, a failover) is logged and the wait goes on over a new
        connection, as the holder's loop goes on after a failed pass: it let the standby exit.

        Raises:
            EngineLeaseAcquisitionTimeoutError: not acquired within LEASE_WAIT_TIMEOUT (the engine
                row is marked stopped first, if the database can be written).
        """
        deadline = time.monotonic() + self.settings.lease_wait_timeout.total_seconds()
        while True:
            try:
                if self.acquire():
                    return True
            except DatabaseError as exc:
                self._failed("store lease wait failed", exc)
            if stopping.is_set():
                return False
            if time.monotonic() >= deadline:
                try:
                    engines.stop_engine(self.engine_id, self.using)
                except DatabaseError as exc:
                    self._failed("could not mark the engine stopped", exc)
                raise EngineLeaseAcquisitionTimeoutError(
                    f"Engine {self.engine_id!r} could not acquire the store-wide lease within "
                    f"{self.settings.lease_wait_timeout} (OWNERSHIP='lease' allows one engine at a time; another "
                    f"engine holds it). Stop the other engine, raise LEASE_WAIT_TIMEOUT, or use "
                    f"OWNERSHIP='workflow-lease' to run several engines."
                )
            try:
                engines.heartbeat_engine(self.engine_id, self.using)
            except DatabaseError as exc:
                self._failed("standby heartbeat failed", exc)
            time.sleep(min(self.settings.lease_renew_interval.total_seconds(), 1.0))

    def _failed(self, what: str, exc: DatabaseError) -> None:
        """A statement of the wait failed: logged, and this thread's connection closed (the next
        statement reconnects)."""
        logger.warning("%s engine=%s error=%s; trying again", what, self.engine_id, exc)
        connections[self.using].close()

    def hold(self, depose_all: Callable[[], object]) -> tuple[bool, bool]:
        """The loop's check on each pass: if renewal found the lease lost, ``depose_all`` (stop driving
        every workflow) and try to take it again. Returns (held now, newly acquired)."""
        if self.lost:
            logger.warning("store lease lost engine=%s: deposed for every workflow", self.engine_id)
            depose_all()
            with self._lock:
                self.epoch, self.lost = None, False
        if self.epoch is None:
            acquired = self.acquire()
            return acquired, acquired
        return True, False

    def renew(self) -> bool:
        """Renew the lease if held (renewal thread). Returns False when it was found lost (at the epoch
        still held: a renewal of an epoch the loop gave up meanwhile reports nothing)."""
        epoch = self.epoch
        if epoch is None or engines.renew_store_lease(
            self.engine_id, epoch, ttl=self.settings.lease_ttl, using=self.using
        ):
            return True
        with self._lock:
            if self.epoch != epoch:
                return True
            self.lost = True
        return False

    def release(self) -> None:
        """Give the lease up (shutdown); a lease row another transaction holds is left to expire."""
        if self.epoch is not None and not engines.release_store_lease(self.engine_id, self.epoch, self.using):
            logger.warning(
                "store lease left held at shutdown engine=%s epoch=%s: its row is locked by another transaction; "
                "it expires after LEASE_TTL",
                self.engine_id,
                self.epoch,
            )


class Renewal:
    """The renewal thread's part: the loop publishes the claims it holds, the thread renews them.

    Args:
        engine_id: this engine.
        settings: the engine's settings (claim TTL, renew interval).
        using: the connection alias.
        session_limit: the server-side session bounds of the engine's connections.
        wake: the loop's wake-ups (lost claims and a lost lease are reported there).
        lease: the store-wide lease (renewed while held).
        on_failure: called with a storage error of a renewal (not a loss: tried again next time).
    """

    def __init__(
        self,
        engine_id: str,
        settings: WeftSettings,
        using: str,
        session_limit: timedelta,
        wake: Wake,
        lease: StoreLease,
        on_failure: Callable[[DatabaseError], None],
    ) -> None:
        self.engine_id = engine_id
        self.settings = settings
        self.using = using
        self.session_limit = session_limit
        self.wake = wake
        self.lease = lease
        self.on_failure = on_failure
        self._held: Mapping[str, Held] = {}  # the loop's live contexts (the same dict object)
        self._evicted: dict[str, int] = {}  # the loop's evicted claims (the same dict object)
        # The dormant claims this thread renewed: workflow id -> (epoch, monotonic time of the next
        # renewal). Only this thread reads or writes it. Its keys are the loop's own id strings and its
        # values one tuple per renewal group and epoch (``_record_dormant``): at 500,000 evicted
        # claims a tuple, a float and a copied id each cost about 80 MB per engine.
        self._dormant: dict[str, tuple[int, float]] = {}
        self.clock: Callable[[], float] = time.monotonic  # when a dormant claim was renewed
        # Whether the last pass wrote the heartbeat: while it does not (a user's transaction holds the
        # engine row; the write is skipped, never waited for), nothing keeps a dormant claim, so every
        # evicted claim is renewed with the TTL, as a resident one, until the heartbeat is written again.
        self.beating = True
        self._random = random.Random()
        self.watch = LoopWatch(self._after_stuck)  # the loop's passes (engine/stall.py): a stuck one hands claims over
        self._stuck_logged: object = _UNSTUCK  # the workflow (None: none) the stuck pass was last logged inside

    def publish(self, held: Mapping[str, Held], evicted: dict[str, int] | None = None) -> None:
        """The loop's dicts of the claims it holds, read at each renewal: ``held``, its live contexts
        by workflow id (each with its claim's ``epoch``), and ``evicted``, the claims it holds without
        a resident generator (engine/residency.py), by workflow id: epoch. Both are the loop's own
        objects, copied in one step under the GIL at each renewal (the loop mutates them), so a pass
        publishes nothing per workflow; call again only when the loop replaces one of them."""
        with self.wake.lock:
            self._held = held
            self._evicted = evicted if evicted is not None else {}

    def epochs(self) -> dict[str, int]:
        """Every claim the loop holds, by workflow id: epoch."""
        resident, evicted = self._published()
        return {**evicted, **resident}

    def _published(self) -> tuple[dict[str, int], dict[str, int]]:
        """The claims the loop holds: (resident ones, evicted ones), by workflow id: epoch."""
        with self.wake.lock:
            # dict(d) of an exact dict copies in C without running Python code; list(d.items()) makes
            # a tuple per entry, which can start a garbage collection whose finalizers let the loop
            # thread change the dict mid-copy ("dictionary changed size during iteration").
            held, evicted = dict(self._held), dict(self._evicted)
        resident = {wid: context.epoch for wid, context in held.items()}
        for wid in resident:  # normally none: a recalled workflow leaves ``evicted`` as it is loaded
            evicted.pop(wid, None)
        return resident, evicted

    def due(self, now: float) -> tuple[dict[str, int], dict[str, int]]:
        """What the next renewal extends: (every resident claim, with the TTL; the dormant claims due,
        with DORMANT_TTL_MULTIPLIER times it). A dormant claim (an evicted workflow's: nothing happens
        to it until a wake-up recalls it) is due when this thread has not renewed it as dormant at its
        epoch, or when the TTL it has left is the TTL itself; a claim that is resident again leaves the
        dormant record, so it is renewed as dormant again at once when evicted again. While the last
        heartbeat was not written (``beating``), every evicted claim is renewed with the TTL instead."""
        resident, evicted = self._published()
        dormant = self._dormant
        if not self.beating:  # renewed with the TTL: renewed as dormant again once the heartbeat is back
            dormant.clear()
            return {**evicted, **resident}, {}
        for wid in [wid for wid in dormant if wid not in evicted]:
            del dormant[wid]
        due = {}
        for wid, epoch in evicted.items():
            seen = dormant.get(wid)
            if seen is None or seen[0] != epoch or seen[1] <= now:
                due[wid] = epoch
        return resident, due

    def thread(self, stop: threading.Event, held: Mapping[str, Held], evicted: dict[str, int]) -> threading.Thread:
        """The renewal thread (not started), running until ``stop`` is set, renewing the claims of the
        loop's dicts ``held`` and ``evicted`` (``publish``) from its first pass: the loop's first pass
        (its first load, a replay that does not return) is renewed too."""
        self.publish(held, evicted)
        return threading.Thread(target=self._loop, args=(stop,), name="weft-renew", daemon=True)

    def _loop(self, stop: threading.Event) -> None:
        interval = self.settings.workflow_claim_renew_interval.total_seconds()
        if self.settings.ownership == OwnershipMode.LEASE:  # each pass renews the store lease too: at its pace
            interval = min(interval, self.settings.lease_renew_interval.total_seconds())
        store_sessions.bind(self.using, self.session_limit)
        due = time.monotonic() + interval  # passes start every interval, however long each took
        try:
            while not stop.wait(max(0.0, due - time.monotonic())):
                due = max(due + interval, time.monotonic())
                try:
                    resident, dormant = self.due(self.clock())
                    if not self.lease.renew():
                        self.wake.up()
                    if self._stuck_pass(resident, interval, stop):
                        continue
                    try:
                        self._renew(resident, dormant, interval, stop)
                    finally:  # the heartbeat keeps the dormant claims: written even if a group failed
                        self.beating = False  # until written (a failed write keeps it False)
                        self.beating = engines.heartbeat_engine(self.engine_id, self.using)
                except DatabaseError as exc:  # a storage error is not a loss: try again next tick
                    self.on_failure(exc)
                    logger.warning("claim renewal failed engine=%s error=%s", self.engine_id, exc)
                    close_old_connections()
                except Exception:  # a bug must not end the thread: every claim would lapse
                    logger.exception("claim renewal pass failed engine=%s; trying again", self.engine_id)
        finally:
            connections.close_all()

    def _stuck_pass(self, resident: dict[str, int], interval: float, stop: threading.Event) -> bool:
        """Whether the loop's current pass has run for STUCK_PASS_TTLS claim TTLs (engine/stall.py); then
        only the claim of the workflow it is inside is renewed, and no heartbeat is written: the others
        lapse and other engines take them over. In "lease" mode the store lease is all there is to hand
        over, and a standby would be held by the same workflow: nothing changes there."""
        if self.settings.ownership == OwnershipMode.LEASE:
            return False
        stuck = self.watch.stuck(STUCK_PASS_TTLS * self.settings.workflow_claim_ttl.total_seconds(), time.monotonic())
        if stuck is None:
            self._stuck_logged = _UNSTUCK
            return False
        if self._stuck_logged != stuck.workflow:
            self._stuck_logged = stuck.workflow
            logger.error(
                "engine loop stuck engine=%s: one pass has run for %.0fs, inside workflow=%s at %s (code that "
                "does not return: Python cannot interrupt it). Its other claims are no longer renewed, so other "
                "engines take those workflows over; that workflow stays here until the pass ends",
                self.engine_id,
                stuck.seconds,
                stuck.workflow,
                stuck.where,
            )
        keep = {wid: epoch for wid, epoch in resident.items() if wid == stuck.workflow}
        if keep:
            self._renew(keep, {}, interval, stop)
        self._report_taken({wid: epoch for wid, epoch in resident.items() if wid != stuck.workflow})
        return True

    def _report_taken(self, epochs: dict[str, int]) -> None:
        """While the loop is stuck: the claims it no longer renews that peers have taken over are reported
        lost as soon as seen (a plain read), so that what is left of the stuck pass, once its call returns,
        advances none of them (``Progress.advance``), and the next pass drops them first."""
        if not epochs:
            return
        current = claims.holders(set(epochs), self.using)
        taken = self._still_held(
            {wid for wid, epoch in epochs.items() if current.get(wid) != (epoch, self.engine_id)}, epochs
        )
        if taken:
            self.wake.report_lost({wid: epochs[wid] for wid in taken})

    def _after_stuck(self) -> None:
        """On the loop thread, once a pass found stuck is over: renew the resident claims still held at
        once and report the others lost, so the next pass stops driving what peers took over before it
        drives anything (the renewal thread would find them only at its next pass). Never raises: a
        failure leaves them to the renewal thread."""
        resident, _ = self._published()
        try:
            _, lost = ownership.renew_each(self.engine_id, resident, self.settings.workflow_claim_ttl, self.using)
        except Exception as exc:  # the loop's own error handling sees a database error on its next statement
            logger.warning("renewal after a stuck pass failed engine=%s error=%s", self.engine_id, exc)
            return
        lost = self._still_held(lost, resident)
        if lost:
            self.wake.report_lost({wid: resident[wid] for wid in lost})

    def _renew(self, resident: dict[str, int], dormant: dict[str, int], interval: float, stop: threading.Event) -> None:
        """Renew the ``resident`` claims with the TTL and the ``dormant`` ones with DORMANT_TTL_MULTIPLIER
        times it, in groups of PACED_GROUP claims spread over PACED_SHARE of the interval
        (``paced_offsets``), reporting the claims each group finds lost at once."""
        ttl = self.settings.workflow_claim_ttl
        long_ttl = ttl * DORMANT_TTL_MULTIPLIER
        # Renewed again as dormant once the TTL it has left is the TTL itself (measured from before the
        # statement, so never later than that): as much margin as a resident claim has.
        again = (long_ttl - ttl).total_seconds()
        groups = [(ids, ttl, resident) for ids in _groups(resident)]
        groups += [(ids, long_ttl, dormant) for ids in _groups(dormant)]
        began, each_pass = time.monotonic(), RenewalPass()  # after a held row, later groups skip held rows at once
        for offset, (group, group_ttl, epochs) in zip(paced_offsets(len(groups), interval), groups, strict=True):
            if stop.wait(max(0.0, began + offset - time.monotonic())):
                return
            sent = self.clock()
            renewed, lost = ownership.renew_each(
                self.engine_id, {wid: epochs[wid] for wid in group}, group_ttl, self.using, each_pass=each_pass
            )
            if epochs is dormant:  # only those renewed: one skipped (its row held) is due again next pass
                self._record_dormant(group, renewed, epochs, sent + again - self._jitter(ttl))
            lost = self._still_held(lost, epochs)
            if lost:
                self.wake.report_lost({wid: epochs[wid] for wid in lost})

    def _record_dormant(self, group: list[str], renewed: set[str], epochs: dict[str, int], due: float) -> None:
        """Record the claims of ``group`` that were renewed as dormant, next due at ``due``: keyed by the
        group's id strings (the loop's, not the copies the statement returned), one (epoch, due) tuple
        shared by every claim of the group at that epoch."""
        shared: dict[int, tuple[int, float]] = {}
        for wid in group:
            if wid in renewed:
                epoch = epochs[wid]
                record = shared.get(epoch)
                if record is None:
                    record = shared[epoch] = (epoch, due)
                self._dormant[wid] = record

    def _jitter(self, ttl: timedelta) -> float:
        """Up to one TTL earlier, per group: the dormant claims renewed in one pass come due again over a
        TTL, not all in one pass."""
        return self._random.uniform(0.0, ttl.total_seconds())

    def _still_held(self, lost: set[str], epochs: dict[str, int]) -> set[str]:
        """The lost claims the loop still holds at the epoch renewed: one it dropped, or took again at
        a new epoch, since the pass read ``epochs`` is no loss of its (a paced pass takes seconds)."""
        if not lost:
            return lost
        with self.wake.lock:
            held, evicted = self._held, self._evicted
            current = {wid: getattr(held.get(wid), "epoch", evicted.get(wid)) for wid in lost}
        return {wid for wid in lost if current[wid] == epochs[wid]}


# A pass whose loop has been inside one call for this many claim TTLs is stuck (engine/stall.py): its
# engine's other claims are no longer renewed. One call, not the pass: a long pass of many short calls
# (load) never is; and two TTLs, so a call slowed down by a loaded machine under the short TTLs of tests
# is not mistaken for one (the claims it holds keep their expiry, and the grace, after that too).
STUCK_PASS_TTLS = 2

_UNSTUCK = object()  # Renewal._stuck_logged while no pass is stuck (None: one stuck outside any workflow)

# An evicted workflow's claim is "dormant": renewed with this many times the TTL, so once per that
# many TTLs less one, instead of every renew interval. At a million parked workflows, renewing every
# claim each interval was one row written per claim per interval and set the signal latency's p99
# (docs/benchmarks.md, issue 16). The engine's heartbeat keeps its dormant claims: once it is more than
# the TTL and the takeover grace old, other engines take them over (store/claims/holding.py), as
# promptly as an expired claim's (ADR 0014).
DORMANT_TTL_MULTIPLIER = 10


def _groups(epochs: dict[str, int]) -> list[list[str]]:
    """The ids of ``epochs`` in sorted groups of PACED_GROUP."""
    ids = sorted(epochs)
    return [ids[at : at + PACED_GROUP] for at in range(0, len(ids), PACED_GROUP)]


# A renewal of many claims is spread out: one group of PACED_GROUP claims (the store's statement
# chunk) after another across PACED_SHARE of the renew interval, rather than back to back. Back to
# back, a renewal of 500,000 claims kept PostgreSQL busy for 4.5 s of every minute (docs/benchmarks.md,
# issue 16), and every commit served meanwhile shared the machine with it; spread out, the same work
# is a small steady load. (Its effect on the million-parked p99 is not measured yet.)
PACED_GROUP = RENEW_CHUNK
PACED_SHARE = 0.5


def paced_offsets(groups: int, interval: float) -> list[float]:
    """When each of ``groups`` renewal groups starts, in seconds after the first: evenly over
    PACED_SHARE of ``interval`` (a group that starts late does not delay the next one further)."""
    step = interval * PACED_SHARE / groups if groups > 1 else 0.0
    return [k * step for k in range(groups)]
