"""OWNERSHIP="lease": a standby engine waiting for the store-wide lease is alive and must look it.

The engine registered its row, then waited for the lease (up to LEASE_WAIT_TIMEOUT, 60 s by default)
before it started the renewal thread, the only writer of its heartbeat. A standby waiting longer than
the claim TTL (30 s) was shown dead by the admin, ``weft engines`` and ``weft doctor`` ("engine(s)
stopped heartbeating without shutting down") while it was alive and ready to take over."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from weft_django.models import Engine, StoreLease
from weft_django.store.clock import db_clock
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

# The engine row's heartbeat is written every WORKFLOW_CLAIM_RENEW_INTERVAL (5 s; the lease mode keeps the
# claim defaults) and an engine silent for WORKFLOW_CLAIM_TTL (30 s) shows dead.
RENEW = timedelta(seconds=5)
LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s"}


def test_a_standby_waiting_for_the_lease_keeps_heartbeating(weft_engines):
    holder = weft_engines("lsh-holder", weft=LEASE)
    wait_for(lambda: StoreLease.objects.filter(engine_id="lsh-holder").exists(), timeout=30, message="the lease")
    standby = weft_engines("lsh-standby", weft={**LEASE, "LEASE_WAIT_TIMEOUT": "120s"})
    wait_for(lambda: Engine.objects.filter(pk="lsh-standby").exists(), timeout=30, message="the standby's row")
    time.sleep(3 * RENEW.total_seconds())
    assert standby.process.poll() is None, standby.output()
    row, now = Engine.objects.get(pk="lsh-standby"), db_clock("default")
    assert row.heartbeat_at > row.started_at and now - row.heartbeat_at <= RENEW, (
        f"a waiting standby wrote no heartbeat: started {now - row.started_at} ago, last heartbeat "
        f"{now - row.heartbeat_at} ago (shown dead once that passes {timedelta(seconds=30)})"
    )

    assert holder.stop() == 0  # the standby takes the lease over, released at shutdown
    wait_for(lambda: StoreLease.objects.filter(engine_id="lsh-standby").exists(), timeout=30, message="handover")
    assert standby.stop() == 0
