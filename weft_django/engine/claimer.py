"""The claimer: takes new and lapsed workflows up to capacity (a claim batch per pass), admits the
waiting runs of the queues it serves (``store/queues.py``), fires due delayed starts, takes over from
other engines where the ownership mode says so, and warns about a second engine where the mode assumes
one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import DatabaseError

from .. import events
from ..conf import WeftSettings
from ..exceptions import ConfigurationError
from ..flow import QueueConfig
from ..status import OwnershipMode
from ..store import engines, queues, runs
from ..store.clock import db_now
from ..store.histories import Loaded
from . import ownership

logger = logging.getLogger("weft_django.engine.engine")


class Claimed(dict[str, int]):
    """The workflows one pass claimed (id: epoch), and ``loaded``: the rows read for some of them by
    the claim statement itself (``ownership.acquire_and_load``; None: none read), for the loader."""

    loaded: Loaded | None = None
    loaded_for: frozenset[str] = frozenset()


# The takeover scan reads every held claim once per this many renew intervals; in between only the
# claims of silent engines (a heartbeat older than the claim TTL, or stopped): a dead engine's claims
# are found as soon as the grace allows, and a claim that lapsed under a live engine within this many
# intervals more.
FULL_TAKEOVER_EVERY = 12


class Claimer:
    """When and what the engine claims.

    Args:
        engine_id: this engine.
        settings: the engine's settings (poll interval, claim batch size, TTL, renew interval).
        using: the connection alias.
        on_taken_over: called for each workflow taken over from another engine (workflow id, epoch,
            previous holder).
        served: the queues of WEFT["QUEUES"] it admits from (None: all of them).
        saturated: whether the engine's activity threads already have as many attempts waiting as
            they run: then, in "workflow-lease" mode while another engine is live (looked up once per
            renew interval), new unheld workflows are acquired only on maintenance passes, one batch
            each (about once per POLL_INTERVAL), not on every wake-up and full-batch rescan: a backlog
            is left to engines with room, and a workflow that needs no thread still starts within a
            poll or so. A single engine, "lease" and "none" claim as before; queue admission (bound by
            the queues' own limits) and takeovers are not throttled.
    """

    def __init__(
        self,
        engine_id: str,
        settings: WeftSettings,
        using: str,
        on_taken_over: Callable[[str, int, str | None], None],
        served: list[str] | None = None,
        saturated: Callable[[], bool] = lambda: False,
    ) -> None:
        self.engine_id = engine_id
        self.saturated = saturated
        self._held_back = False  # the throttle skipped or cut an acquire: scan again once it ends
        self._more_delayed = False  # the last delayed-start pass was full: fire again on the next pass
        self._peers: tuple[float, bool] | None = None  # (time.monotonic() of the look, another engine is live)
        self.settings = settings
        self.using = using
        self.mode = settings.ownership
        self.on_taken_over = on_taken_over
        self.last_claim_scan = 0.0  # time.monotonic() of the last acquire scan; 0.0: scan on the next pass
        self.backlog = False  # the last acquire was a full batch: more may be waiting (claim_ahead)
        self._ahead = False  # claim_ahead took the next pass's full-batch rescan: claim() skips that once
        self.last_takeover_scan = 0.0
        self.last_full_takeover_scan = 0.0
        self.take_over_now = False  # take the claims of other engines on the next pass
        # Claims a pass committed before one of its later statements failed (the pass raised): handed
        # over by the next claim(), released by a shutdown before it.
        self.stranded: dict[str, int] = {}
        self._warned_engines: set[str] = set()
        unknown = sorted(set(served or ()) - set(settings.queues))
        if unknown:
            raise ConfigurationError(
                f'--queues names {", ".join(unknown)}, not in WEFT["QUEUES"] '
                f"(defined: {', '.join(sorted(settings.queues)) or 'none'}). Add it there or fix the name."
            )
        self.served = sorted(set(served)) if served is not None else None
        self.queues: list[QueueConfig] = [
            config for name, config in sorted(settings.queues.items()) if served is None or name in served
        ]

    @property
    def capacity(self) -> int:
        """How many workflows one pass claims at most."""
        return self.settings.claim_batch_size

    def scan_soon(self) -> None:
        """Scan for claimable work on the next pass (children were started, a batch was full)."""
        self.last_claim_scan = 0.0

    def slot_freed(self, ended: bool) -> None:
        """A run of ours ended (``ended``): with queues served, admit on the next pass (its slot may be free)."""
        if ended and self.queues:
            self.scan_soon()

    def claimable(self) -> bool:
        """Whether a run waits for an engine now (an unheld claim, a due delayed start, a queued run its
        queue would admit)."""
        if runs.claimable(db_now(self.using), self.using):
            return True
        return any(queues.admissible(self.engine_id, queue, self.using) for queue in self.queues)

    def takeover_due(self, clock: float) -> bool:
        """Whether the next pass looks for lapsed claims (once per renew interval; per poll in "lease")."""
        poll = self.settings.poll_interval.total_seconds()
        every = (
            poll if self.mode == OwnershipMode.LEASE else self.settings.workflow_claim_renew_interval.total_seconds()
        )
        return clock - self.last_takeover_scan >= every

    def claim(self, *, force: bool, scan: bool) -> Claimed:
        """Claim what is due this pass. Returns the claimed workflows (id: epoch), with what was read
        for some of them in the same round trip (``Claimed.loaded``).

        Args:
            force: a wake-up named a workflow this engine does not hold (acquire now).
            scan: a maintenance pass (acquire if POLL_INTERVAL passed, fire due delayed starts).

        Raises:
            DatabaseError: a statement failed; what the pass claimed before it is returned by the next call.
        """
        claimed = Claimed(self.stranded)
        self.stranded = {}
        try:
            self._claim_into(claimed, force=force, scan=scan)
        except DatabaseError:  # what was claimed before the failure is committed: the next pass loads it
            self.stranded = dict(claimed)
            raise
        return claimed

    def _claim_into(self, claimed: Claimed, *, force: bool, scan: bool) -> None:
        poll = self.settings.poll_interval.total_seconds()
        clock = time.monotonic()
        throttled = self._throttled(clock)
        # A full batch or new children: look again now; so too once a throttle that held work back ends.
        requested = self.last_claim_scan == 0.0 or (self._held_back and not throttled)
        scan_due = requested or (scan and clock - self.last_claim_scan >= poll)
        # The rescan a full batch asks for, or a maintenance pass's, ran beside the last commit (claim_ahead,
        # the same acquire a moment ago); a wake-up naming a workflow not held still acquires at once.
        skip, self._ahead = self._ahead and not force, False
        if force or scan_due:
            self._held_back = throttled and not scan
            if not (self._held_back or skip):  # a backlog of attempts: one batch per maintenance pass only
                # (a pass held back leaves last_claim_scan alone: the next maintenance pass is due)
                self.last_claim_scan = clock
                got = self._acquire_free(claimed)
                events.claims_acquired(self.engine_id, got, self.using)
                claimed.update({wid: epoch for wid, (epoch, _) in got.items()})
                self.backlog = len(got) >= self.capacity
                if self.backlog:  # a full batch: more may be waiting, scan again next tick
                    self._held_back = throttled
                    self.last_claim_scan = clock if throttled else 0.0
            claimed.update(self._admit())  # queues bound themselves (their limits, per_engine)
        if scan or self._more_delayed:  # delayed starts send no wake-up: the maintenance scan finds them
            # (once per poll, not on every rescan a full batch asks for), and a full batch looks again
            fired = ownership.fire_delayed_starts(
                self.engine_id, limit=self.capacity, ttl=self.settings.workflow_claim_ttl, using=self.using
            )
            self._more_delayed = len(fired) >= self.capacity
            claimed.update(fired)
        if self.take_over_now or (self.mode == OwnershipMode.LEASE and clock - self.last_takeover_scan >= poll):
            got = ownership.take_over_from_others(
                self.engine_id, limit=self.capacity, ttl=self.settings.workflow_claim_ttl, using=self.using
            )
            self.take_over_now = len(got) >= self.capacity  # more left: take them on the next pass
            for wid, (epoch, previous) in got.items():
                logger.warning(
                    "took over workflow=%s engine=%s epoch=%s previous=%s mode=%s",
                    wid,
                    self.engine_id,
                    epoch,
                    previous,
                    self.mode,
                )
                self.on_taken_over(wid, epoch, previous)
            claimed.update({wid: epoch for wid, (epoch, _) in got.items()})
        if clock - self.last_takeover_scan >= self.settings.workflow_claim_renew_interval.total_seconds():
            self.last_takeover_scan = clock
            self._detect_second_instance()
            got = self._take_lapsed(clock)
            for wid, (epoch, previous) in got.items():
                logger.warning(
                    "took over workflow=%s engine=%s epoch=%s previous=%s", wid, self.engine_id, epoch, previous
                )
                self.on_taken_over(wid, epoch, previous)
            claimed.update({wid: epoch for wid, (epoch, _) in got.items()})
            if len(got) >= self.capacity:
                self.last_takeover_scan = 0.0  # a full pass: start the next one at once

    def claim_ahead(self) -> Claimed:
        """The next batch of a backlog (the last acquire was full), taken while the pass's commit is in
        flight (engine.py): unheld runnable workflows only, no takeover, admission or delayed start.
        It is the acquire of the next pass (its full-batch rescan or maintenance scan), which then does
        not acquire again unless a wake-up names a workflow it does not hold. Returns what it claimed
        (with its load, as ``claim``).

        Raises:
            DatabaseError: the acquire failed (nothing claimed: one transaction).
        """
        claimed = Claimed()
        clock = time.monotonic()
        if not self.backlog or self._throttled(clock):
            return claimed
        got = self._acquire_free(claimed)
        events.claims_acquired(self.engine_id, got, self.using)
        claimed.update({wid: epoch for wid, (epoch, _) in got.items()})
        self.backlog = len(got) >= self.capacity
        self.last_claim_scan = 0.0 if self.backlog else clock
        self._ahead = True
        return claimed

    def may_throttle(self) -> bool:
        """Whether a saturated executor would hold new acquires back now ("workflow-lease" with another
        engine live): a claim ahead, which runs before the pass's attempts are dispatched, then waits."""
        return self.mode == OwnershipMode.WORKFLOW_LEASE and self._others_live(time.monotonic())

    def _throttled(self, clock: float) -> bool:
        """Whether new unheld workflows are acquired only once per maintenance pass (about once per
        POLL_INTERVAL) instead of on every wake-up and full-batch rescan: the activity threads have as
        many attempts waiting as they run, and another "workflow-lease" engine is live to take them.
        Never under "lease" / "none" (one engine drives every workflow)."""
        return self.mode == OwnershipMode.WORKFLOW_LEASE and self.saturated() and self._others_live(clock)

    def _others_live(self, clock: float) -> bool:
        """Whether another engine is live (a heartbeat within the claim TTL), looked up at most once
        per renew interval."""
        every = self.settings.workflow_claim_renew_interval.total_seconds()
        if self._peers is None or clock - self._peers[0] >= every:
            others = engines.other_live_engines(
                self.engine_id, within=self.settings.workflow_claim_ttl, using=self.using
            )
            self._peers = (clock, bool(others))
        return self._peers[1]

    def _take_lapsed(self, clock: float) -> dict[str, tuple[int, str | None]]:
        """The takeover scan: every held claim once per FULL_TAKEOVER_EVERY renew intervals, else
        only the claims of silent engines (none silent: no scan)."""
        every = self.settings.workflow_claim_renew_interval.total_seconds() * FULL_TAKEOVER_EVERY
        if clock - self.last_full_takeover_scan >= every:
            self.last_full_takeover_scan = clock
            return self._acquire(takeover=True)
        silent = engines.silent_engines(within=self.settings.workflow_claim_ttl, using=self.using)
        return self._acquire(takeover=True, holders=silent) if silent else {}

    def _admit(self) -> dict[str, int]:
        """Admit what the served queues let in now, one transaction per queue (``store.queues.admit``)."""
        admitted: dict[str, int] = {}
        for queue in self.queues:
            try:
                got = queues.admit(
                    self.engine_id, queue, limit=self.capacity, ttl=self.settings.workflow_claim_ttl, using=self.using
                )
            except DatabaseError as exc:  # a statement failed: try again on the next pass (a held lock is no error)
                logger.warning("queue admission failed engine=%s queue=%s error=%s", self.engine_id, queue.name, exc)
                continue
            if got:
                logger.debug("admitted engine=%s queue=%s workflows=%s", self.engine_id, queue.name, sorted(got))
            if len(got) >= self.capacity:
                self.last_claim_scan = 0.0  # a full batch: more may be waiting
            admitted.update(got)
        return admitted

    def _acquire_free(self, into: Claimed) -> dict[str, tuple[int, str | None]]:
        """Unheld runnable workflows, with their load in the same round trip where the database allows
        (kept in ``into.loaded`` for the loader)."""
        try:
            both = ownership.acquire_and_load(
                self.engine_id,
                limit=self.capacity,
                ttl=self.settings.workflow_claim_ttl,
                using=self.using,
                served=self.served,
                # claim_acquired is sent as soon as this returns: then the acquire waits for its flush
                # (ADR 0015 skips it only where nothing acknowledges the claims before a fenced commit)
                flush=events.claims_acquired_heard(),
            )
        except DatabaseError as exc:  # nothing was claimed (one transaction): a load that keeps failing
            # must not keep the oldest batch from every engine, so this pass claims first, then loads
            logger.warning("acquire-and-load failed engine=%s error=%s; acquiring alone", self.engine_id, exc)
            both = None
        if both is None:
            return self._acquire(takeover=False)
        got, into.loaded = both
        into.loaded_for = frozenset(got) if into.loaded is not None else frozenset()
        return got

    def _acquire(self, *, takeover: bool, holders: list[str] | None = None) -> dict[str, tuple[int, str | None]]:
        return ownership.acquire(
            self.engine_id,
            limit=self.capacity,
            ttl=self.settings.workflow_claim_ttl,
            renew_interval=self.settings.workflow_claim_renew_interval,
            using=self.using,
            takeover=takeover,
            holders=holders,
            served=self.served,  # --queues: another queue's released runs are left to its engines
        )

    def _detect_second_instance(self) -> None:
        if not self.settings.detect_second_instance or self.mode == OwnershipMode.WORKFLOW_LEASE:
            return
        others = engines.other_live_engines(self.engine_id, within=self.settings.workflow_claim_ttl, using=self.using)
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
