"""Claims: the engine's policy for acquiring, renewing, releasing and taking over workflows, the
engine rows and the store-wide lease. The statements are in ``weft_django.store.claims`` (the only
writer of claim rows) and ``weft_django.store.engines``; every one uses the database clock
(clock_timestamp()), never the engine's.

acquire / takeover: candidates are locked with SKIP LOCKED and rewritten with a fresh epoch only if
they still have the exact holder and epoch that were seen: one row back means it is ours.
renew: one statement for all of an engine's claims, skipping rows a commit holds (the commit in flight
proves ownership; retried next tick). A claim is lost only when a plain re-read shows another epoch
or holder.
held_to_load: the claims of workflows loaded again without a live context (a recall, a reload) are
renewed before their load, which goes on only for those renewed at their epoch (a claim whose row
another transaction holds waits for a later pass).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from django.db import Error, OperationalError, connections, transaction

from .. import events
from ..conf import WeftSettings
from ..exceptions import OwnershipModeMismatchError
from ..store import claims, engines
from ..store.claims import TAKEOVER_GRACE_MULTIPLIER, taking
from ..store.claims.renewal import RenewalPass
from ..store.clock import db_now
from ..store.histories import Loaded
from ..store.notify import send

logger = logging.getLogger(__name__)
T = TypeVar("T")
# Start-up's writes are tried again this long after the database refused them for now (seconds),
# doubling up to the second figure.
START_UP_RETRY = (0.5, 5.0)
_engine_log = logging.getLogger("weft_django.engine.engine")  # the loop's "stopped driving" lines


def takeover_grace(settings: WeftSettings) -> timedelta:
    """How long after its expiry a claim may be taken over: TAKEOVER_GRACE_MULTIPLIER renew intervals."""
    return claims.takeover_grace(settings.workflow_claim_renew_interval)


def acquire(
    engine_id: str,
    *,
    limit: int,
    ttl: timedelta,
    renew_interval: timedelta,
    using: str,
    takeover: bool = False,
    holders: list[str] | None = None,
    served: list[str] | None = None,
) -> dict[str, tuple[int, str | None]]:
    """Claim up to ``limit`` running workflows that no engine holds (or, with ``takeover``, whose holder's
    claim expired more than the grace, TAKEOVER_GRACE_MULTIPLIER renew intervals, ago; with ``holders``
    too, only the claims these engines hold are read). ``served``: the queues this engine serves (None:
    all): an unheld run of another queue is left to the engines serving it (takeover takes any).

    Returns:
        {workflow_id: (new epoch, previous holder)}.
    """
    grace = claims.takeover_grace(renew_interval) if takeover else None
    return claims.acquire(
        engine_id, limit=limit, ttl=ttl, using=using, grace=grace, holders=holders, served=None if takeover else served
    )


def claims_of_a_previous_process(engine: Any, settings: WeftSettings) -> None:
    """At start-up: the claims still held under this engine's id by a process that died without releasing
    them (``kill -9``, then a restart with the same ``--engine-id``). The new process's heartbeat keeps the
    id alive, so such a claim lapses by its expiry only: a dormant one (ADR 0014) is cut to one TTL from
    now, to be taken over after the TTL and the grace like any other. Then they are reported (events).

    Args:
        engine: the engine starting (``engine_id``, ``using``); ``settings``: its settings.
    """
    claims.cap_expiry(engine.engine_id, settings.workflow_claim_ttl, engine.using)
    events.claims_left_by_previous_process(engine, takeover_grace(settings))


def start_up(engine: Any, settings: WeftSettings) -> bool:
    """The engine's start-up writes: the ownership mode marker, its engine row, the claims of a previous
    process with its id. Each is tried again while the database refuses it for now
    (``retried_at_start_up``). Returns False when the engine was asked to stop meanwhile.

    Raises:
        OwnershipModeMismatchError: the database runs under another OWNERSHIP mode.
    """
    steps: tuple[tuple[str, Callable[[], object]], ...] = (
        ("mode marker and engine row", lambda: _record_mode_and_register(engine, settings)),
        ("previous claims", lambda: claims_of_a_previous_process(engine, settings)),
    )
    for step, call in steps:
        retried_at_start_up(engine, step, call)
        if engine.stopping.is_set():
            return False
    return True


def _record_mode_and_register(engine: Any, settings: WeftSettings) -> None:
    """The mode checked against the marker (its row locked) and the engine row written in ONE
    transaction: a ``--reset-ownership-mode`` (the marker locked, then the look for live engines, then
    the delete: ``store.engines.reset_mode_marker_unless_alive``) sees this engine alive, or comes
    wholly before it and this engine records its mode again. A mismatch writes nothing."""
    with transaction.atomic(using=engine.using):
        check_mode_marker(engine.engine_id, settings.ownership, engine.using)
        engines.register_engine(engine.engine_id, settings.ownership, engine.using, queues=engine.claimer.served)


def retried_at_start_up(engine: Any, step: str, call: Callable[[], T]) -> T | None:
    """``call()``, tried again after a back-off (START_UP_RETRY, a WARNING line each time) while it
    raises ``OperationalError``: the database refuses it for now, e.g. SQLite's "database is locked"
    once another connection held the one write lock (a user's open ``BEGIN IMMEDIATE``, another
    engine's long commit) past the busy timeout, or a connection lost. The engine's passes wait the
    same way; start-up used to fail and the command to exit. None once the engine is asked to stop.

    Args:
        engine: the engine starting (``engine_id``, ``using``, ``stopping``); ``step``: its name, logged.
    """
    delay, longest = START_UP_RETRY
    while not engine.stopping.is_set():
        try:
            return call()
        except OperationalError as exc:
            connections[engine.using].close()  # as after a failed pass: the next attempt reconnects
            logger.warning(
                "engine start-up waits for the database engine=%s step=%s retry_in=%.1fs error=%s",
                engine.engine_id,
                step,
                delay,
                exc,
            )
            engine.stopping.wait(delay)
            delay = min(2 * delay, longest)
    return None


def acquire_and_load(
    engine_id: str,
    *,
    limit: int,
    ttl: timedelta,
    using: str,
    served: list[str] | None = None,
    flush: bool = False,
) -> tuple[dict[str, tuple[int, str | None]], Loaded | None] | None:
    """``acquire`` of unheld workflows with their load in the same round trip where the database
    allows it (``store/claims/taking.py``); None where it does not (acquire, then load, as before).
    ``flush``: its commit waits for the WAL flush (the claims are acknowledged once it returns).

    Returns:
        ({workflow_id: (new epoch, previous holder)}, what was read for them, or None if a row could
        not be converted and the caller must load them itself), or None.
    """
    if not taking.available(using):
        return None
    return taking.acquire_and_load(engine_id, limit=limit, ttl=ttl, using=using, served=served, flush=flush)


def renew(engine_id: str, owned: dict[str, int], ttl: timedelta, using: str) -> set[str]:
    """Extend every claim still held at its epoch. Returns the ids found lost (another epoch or
    holder on a plain re-read); rows skipped because a commit holds them are neither renewed nor lost."""
    return claims.renew(engine_id, owned, ttl, using)


def renew_each(
    engine_id: str, owned: dict[str, int], ttl: timedelta, using: str, *, each_pass: RenewalPass | None = None
) -> tuple[set[str], set[str]]:
    """``renew``, saying which claims it renewed. Returns (the ids renewed, the ids found lost); an id
    in neither was skipped (a transaction held its row: renewed next time). ``each_pass``: the renewal
    pass the call is part of (after a held row, its later calls skip held rows at once)."""
    return claims.renew_each(engine_id, owned, ttl, using, each_pass=each_pass)


class ClaimHolder(Protocol):
    """The engine as ``held_to_load`` sees it (engine.py's Engine, residency.py's EngineHost)."""

    engine_id: str
    settings: WeftSettings
    using: str


def held_to_load(
    engine: ClaimHolder, epochs: Mapping[str, int], reason: str, *, wait: bool = True
) -> tuple[dict[str, int], dict[str, int]]:
    """Renew the claims of workflows about to be loaded again without a live context (a recall of evicted
    ones, a reload after a refused or failed commit); the claims found lost are logged (``stopped driving
    workflow=... reason=<reason>``) and left out, never replayed and driven by a non-owner. Such a claim
    may have lapsed and been taken over meanwhile: the renewal thread renews what the loop publishes,
    resident claims and evicted ones (as dormant, rarely), not those waiting to be reloaded (loads that
    keep failing, a database error). Renewed, not only read: a lapsed claim not taken yet could be taken
    between a read and the load, and the workflow's next step (a local activity runs before the fenced
    commit) run on a non-owner. One statement, never waiting long for a row another transaction holds
    (that row is skipped), and a re-read of those it did not renew.

    A claim whose row another transaction held is not loaded now even when the re-read shows it still
    ours: that transaction may be a peer's takeover about to commit (the read sees the claim as it was
    before it), and a load would drive the workflow on this engine after it lost the claim. It waits for
    a later pass, which renews it again. With ``wait`` False (some were skipped by the last call: a
    user's transaction may keep their rows for long) held rows are skipped at once, not after
    PLAIN_LOCK_WAIT_MS: a pass of the engine does not wait for them each time.

    Returns:
        (the claims renewed, to load now; the claims skipped but still ours on the re-read, to load later).

    Raises:
        DatabaseError: the renewal failed (nothing is left out: the caller tries again later).
    """
    ttl, each_pass = engine.settings.workflow_claim_ttl, RenewalPass(plain=wait)
    renewed, lost = renew_each(engine.engine_id, dict(epochs), ttl, engine.using, each_pass=each_pass)
    for wid in sorted(lost):
        _engine_log.warning(
            "stopped driving workflow=%s engine=%s epoch=%s reason=%s", wid, engine.engine_id, epochs[wid], reason
        )
    now = {wid: epoch for wid, epoch in epochs.items() if wid in renewed}
    later = {wid: epoch for wid, epoch in epochs.items() if wid not in renewed and wid not in lost}
    return now, later


def release(engine_id: str, owned: dict[str, int], using: str) -> None:
    """Release claims at their epochs (graceful shutdown): holder cleared, epoch kept."""
    if owned:
        with transaction.atomic(using=using):
            claims.release_claims(engine_id, owned, using)
            send("w", "*", using)  # peers rescan at once instead of at their next poll


class Stopping(Protocol):
    """The engine as ``release_at_shutdown`` sees it (engine.py's Engine)."""

    engine_id: str
    using: str
    lease: Any


def release_at_shutdown(engine: Stopping, held: dict[str, int]) -> bool:
    """Shutdown's writes: release the claims ``held`` (at their epochs) and the store lease, mark the engine
    row stopped. Each is tried on its own, and once more over a new connection after a database error (the
    connection cut by a failover, a proxy, pg_terminate_backend, maybe while the loop sat idle): a failed
    release no longer skips the others, and a cut connection no longer leaves every claim to the peers'
    wait for its TTL and the grace (the release's NOTIFY lets them claim at once), the lease to a standby's
    wait, or the engine row reading as alive. What fails twice is logged (``could not ... at shutdown``)
    and left to expire. Returns whether the claims were released."""
    steps: tuple[tuple[str, Callable[[], object]], ...] = (
        ("release claims", lambda: release(engine.engine_id, held, engine.using)),
        ("release the store lease", engine.lease.release),
        ("mark the engine stopped", lambda: _mark_stopped(engine)),
    )
    done = []
    for what, step in steps:
        for again in (False, True):
            try:
                step()
            except Error as exc:  # an InterfaceError too (a connection already closed)
                connections[engine.using].close()  # the next statement reconnects
                if again:
                    _engine_log.exception("could not %s at shutdown engine=%s", what, engine.engine_id)
                else:
                    _engine_log.warning(
                        "could not %s at shutdown engine=%s error=%s; trying again over a new connection",
                        what,
                        engine.engine_id,
                        exc,
                    )
                continue
            done.append(what)
            break
    return "release claims" in done


def _mark_stopped(engine: Stopping) -> None:
    if not engines.stop_engine(engine.engine_id, engine.using):
        _engine_log.warning(
            "engine row left unmarked at shutdown engine=%s: another transaction holds it "
            "(a user's open transaction?); it reads as silent once its heartbeat is older than the claim TTL",
            engine.engine_id,
        )


def fire_delayed_starts(engine_id: str, *, limit: int, ttl: timedelta, using: str) -> dict[str, int]:
    """Start pending workflows whose delayed_start timer is due, folding the acquire into the same
    transaction (an engine-side enabling write). Any engine may do it; SKIP LOCKED splits the work.
    Returns {workflow_id: epoch} of the runs started (and claimed)."""
    started = claims.start_delayed(engine_id, limit=limit, ttl=ttl, now=db_now(using), using=using)
    if started:
        events.claims_acquired(engine_id, started, using)
    return started


def check_mode_marker(engine_id: str, mode: str, using: str) -> None:
    """Refuse to run beside engines configured with another fencing mode: the first engine records
    its mode in a one-row marker; an engine of another mode raises OwnershipModeMismatchError.
    After stopping every engine, ``reset_mode_marker()`` allows a deliberate change of mode.

    Raises:
        OwnershipModeMismatchError: the database runs under another OWNERSHIP mode.
    """
    stored, set_by, created = engines.mode_marker(engine_id, mode, using)
    if not created and stored != mode:
        set_at = engines.mode_set_at(using)
        when = f"{set_at:%Y-%m-%d %H:%M:%S}" if set_at is not None else "a time Python cannot represent"
        raise OwnershipModeMismatchError(
            f"This database runs under OWNERSHIP={stored!r} (set by engine {set_by!r} at "
            f"{when}), but this engine is configured with OWNERSHIP={mode!r}. "
            f"Engines with different fencing modes must not share a database. To change the mode, stop every "
            f"engine, run `python manage.py weft_engine --reset-ownership-mode`, then start them with the new setting."
        )


# -- "lease": one store-wide lease --------------------------------------------------------------


def acquire_store_lease(engine_id: str, *, ttl: timedelta, renew_interval: timedelta, using: str) -> int | None:
    """Take the store-wide lease if nobody holds it or its holder's lease expired more than the grace
    ago (the same rule as a workflow claim). Returns the new lease epoch, or None."""
    grace = claims.takeover_grace(renew_interval)
    return engines.acquire_store_lease(engine_id, ttl=ttl, grace=grace, using=using)


def take_over_from_others(
    engine_id: str, *, limit: int, ttl: timedelta, using: str
) -> dict[str, tuple[int, str | None]]:
    """Take running workflows held by any other engine at once, without waiting for their claims to
    expire. Only for an engine that is the single legitimate owner: the store-lease holder, or a
    "none"-mode engine at start-up (its predecessor is presumed gone)."""
    return claims.take_over(engine_id, limit=limit, ttl=ttl, using=using)


__all__ = [
    "TAKEOVER_GRACE_MULTIPLIER",
    "acquire",
    "acquire_store_lease",
    "check_mode_marker",
    "fire_delayed_starts",
    "release",
    "renew",
    "take_over_from_others",
]
