"""OWNERSHIP="lease": a user's open transaction holding the store lease's row (SELECT ... FOR UPDATE)
must not stall the holder's renewal of its workflow claims or its heartbeat.

The renewal pass renewed the lease first, waiting for the row up to the session's lock_timeout (half
the TTL); the DatabaseError that ended the wait skipped the whole pass: no claim renewed, no heartbeat
written: held longer than the claim TTL and the grace, a live holder showed dead and its claims
lapsed."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection

import weft_django as weft
from tests.engine.test_commit_locks import holding
from weft_django.models import Engine, StoreLease, WorkflowClaim
from weft_django.store.clock import db_clock
from weft_django.testing import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

# The claims keep their defaults (TTL 30 s, renewed every 5 s; the lease mode reads only its own
# durations); the engine's sessions wait at most half the lease TTL (1.5 s) for a lock.
LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s"}
CLAIM_TTL = timedelta(seconds=30)


def test_a_held_lease_row_does_not_stop_the_claims_renewal_or_the_heartbeat(weft_engines):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    handle = weft.start("tests.signals", id="lrl")
    engine = weft_engines("lrl-engine", weft=LEASE)
    wait_for(lambda: WorkflowClaim.objects.filter(pk="lrl", engine_id="lrl-engine").exists(), timeout=30)
    epoch = WorkflowClaim.objects.get(pk="lrl").epoch
    with holding("SELECT 1 FROM weft_django_storelease WHERE id = 1 FOR UPDATE", [], hold_at_most=40):
        locked_at = db_clock("default")
        time.sleep(12)  # two renew intervals of the claims (5 s), and more
        beat = Engine.objects.get(pk="lrl-engine").heartbeat_at
        claim = WorkflowClaim.objects.get(pk="lrl")
    assert beat > locked_at, f"no heartbeat while the lease row was held: last {locked_at - beat} before the lock"
    assert claim.expires_at is not None and claim.expires_at > locked_at + CLAIM_TTL, (
        f"the claim was not renewed while the lease row was held: expires {claim.expires_at}, lock at {locked_at}"
    )
    assert (claim.engine_id, claim.epoch) == ("lrl-engine", epoch)
    assert StoreLease.objects.get().engine_id == "lrl-engine"
    handle.signal("go", "after")
    assert handle.result(timeout=30) == "after"
    assert engine.stop() == 0


def test_an_engine_waiting_for_a_free_lease_row_a_user_holds_heartbeats_and_stops_at_once(weft_engines):
    """The lease free (its holder stopped, or died and its lease lapsed) but its row held by a user's open
    transaction: an engine's attempt to take it (an UPDATE of the row, which matches) waited for the
    session's whole lock_timeout (15 s with the default LEASE_TTL), each time: the heartbeat it writes
    between attempts was that late, and SIGTERM waited for the attempt to end. Now a held row is waited
    for COMMIT_LOCK_WAIT_MS and the lease is not taken this time (tried again a second later)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    StoreLease.objects.create(id=1, epoch=0)  # free: no holder
    slow = {"OWNERSHIP": "lease", "LEASE_WAIT_TIMEOUT": "120s"}  # LEASE_TTL 30 s: lock_timeout 15 s
    with holding("SELECT 1 FROM weft_django_storelease WHERE id = 1 FOR UPDATE", [], hold_at_most=60) as released:
        waiting = weft_engines("lrs-waiting", weft=slow)
        wait_for(lambda: Engine.objects.filter(pk="lrs-waiting").exists(), timeout=30)
        time.sleep(2)  # its first attempt is under way
        beats = set()
        for _ in range(6):
            beats.add(Engine.objects.get(pk="lrs-waiting").heartbeat_at)
            time.sleep(1)
        began = time.monotonic()
        code = waiting.stop()
        took = time.monotonic() - began
        assert (len(beats) >= 3, took < 5, code) == (True, True, 0), (sorted(beats), took, waiting.output()[-1500:])
        assert not released.is_set()
    assert StoreLease.objects.get().engine_id is None
