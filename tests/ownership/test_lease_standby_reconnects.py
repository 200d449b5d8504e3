"""OWNERSHIP="lease": a standby waiting for the store-wide lease outlives a transient database error.

The wait for the lease (``StoreLease.wait``, in ``Engine.start()``) let any DatabaseError of its acquire
or heartbeat out of the engine: a standby whose connection was cut while it waited (a failover of the
database, a proxy's restart, pg_terminate_backend) exited with a traceback instead of reconnecting and
waiting again, as the lease holder's loop does after a failed pass; the standby a deployment keeps for
the holder's failure was gone."""

from __future__ import annotations

import pytest
from django.db import connection

from weft_django.models import Engine, StoreLease
from weft_django.testing import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s"}


def _terminate_sessions(engine_id: str) -> int:
    """pg_terminate_backend every session of the engine subprocess (named by PGAPPNAME)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            [f"weft-{engine_id}"[:63]],
        )
        return int(cursor.fetchone()[0])


def _heartbeat(engine_id: str) -> object:
    return Engine.objects.filter(pk=engine_id).values_list("heartbeat_at", flat=True).first()


def test_a_standby_whose_connection_is_cut_while_it_waits_reconnects_and_takes_the_lease(weft_engines):
    if connection.vendor != "postgresql":
        pytest.skip("pg_terminate_backend is PostgreSQL's")
    holder = weft_engines("lsr-holder", weft=LEASE)
    wait_for(lambda: StoreLease.objects.filter(engine_id="lsr-holder").exists(), timeout=30, message="the lease")
    standby = weft_engines("lsr-standby", weft={**LEASE, "LEASE_WAIT_TIMEOUT": "120s"})
    wait_for(lambda: _heartbeat("lsr-standby"), timeout=30, message="the standby's row")
    first = _heartbeat("lsr-standby")
    wait_for(lambda: _heartbeat("lsr-standby") != first, timeout=30, message="the standby waiting (heartbeating)")

    assert _terminate_sessions("lsr-standby") >= 1
    cut = _heartbeat("lsr-standby")
    # Waiting again: its heartbeat moves on (a standby that exited writes none).
    wait_for(
        lambda: _heartbeat("lsr-standby") != cut or standby.process.poll() is not None,
        timeout=30,
        message="the standby's next heartbeat",
    )
    assert standby.process.poll() is None, f"the standby exited on a cut connection:\n{standby.output()[-3000:]}"

    assert holder.stop() == 0  # the lease is released at shutdown: the standby takes it
    wait_for(lambda: StoreLease.objects.filter(engine_id="lsr-standby").exists(), timeout=30, message="handover")
    assert standby.stop() == 0, standby.output()[-3000:]
