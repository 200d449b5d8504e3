"""Shutdown when the engine's connection is cut as it releases its claims (a failover, a proxy or
pg_terminate_backend ending the session).

``Engine.shutdown`` released the claims, then the store lease, then marked its engine row stopped, all in
one ``try``: the release's DatabaseError (not a lock timeout: a row another transaction holds is skipped,
tests/ownership/test_release_past_a_held_row.py) skipped the lease's release and the stopped mark. The
claims stayed held by an engine that was gone, so its peers waited out their TTL and the takeover
grace instead of claiming them at once (the release's NOTIFY), a "lease" standby waited out the lease's,
and the engine row read as alive (admin, doctor, ``--reset-ownership-mode``) until its heartbeat aged.

Here the engine's own backend is ended (pg_terminate_backend from another connection) just before its
release statement runs: a real cut, on a real PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings

import weft_django as weft
from tests.engine.ticking import tick_until
from weft_django.conf import get_settings
from weft_django.engine import ownership
from weft_django.engine.engine import Engine
from weft_django.models import Engine as EngineRow
from weft_django.models import StoreLease, WorkflowClaim

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
RELEASE = "SET engine_id = NULL, claimed_at = NULL, expires_at = NULL FROM mine"  # store/claims/holding.py
MODES = {
    "workflow-lease": {"POLL_INTERVAL": "60s"},
    "lease": {"POLL_INTERVAL": "60s", "OWNERSHIP": "lease", "LEASE_TTL": "30s", "LEASE_RENEW_INTERVAL": "5s"},
}


def _terminate(pid: int) -> None:
    """End backend ``pid`` from a connection of another thread."""

    def run() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_connection_cut_at_the_release_still_releases_and_marks_the_engine_stopped(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("pg_terminate_backend is PostgreSQL's")
    with override_settings(WEFT=MODES[mode]):
        engine, wid = Engine("scc-engine", concurrency=2), "scc-0"
        engine.start()
        cut: list[int] = []
        failed: list[str] = []

        def cut_before_the_release(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if RELEASE in sql and not cut:
                cut.append(context["connection"].connection.info.backend_pid)
                _terminate(cut[0])  # the statement below meets a session the server has ended
                try:
                    return execute(sql, params, many, context)
                except Exception as exc:
                    failed.append(f"{type(exc).__name__}: {exc}")
                    raise
            return execute(sql, params, many, context)

        try:
            weft.start("tests.signals", id=wid)
            tick_until(engine, lambda: wid in engine.owned, "the engine holds the claim")
        finally:
            with connection.execute_wrapper(cut_before_the_release):
                engine.shutdown()
        connections["default"].close()  # the test's connection was the engine's loop connection
        assert cut and failed, f"the release statement was not cut: {cut} {failed}"
        row = EngineRow.objects.get(pk="scc-engine")
        holder = WorkflowClaim.objects.get(pk=wid).engine_id
        lease = StoreLease.objects.filter(pk=1).values_list("engine_id", flat=True).first()
        assert row.stopped_at is not None, f"the engine row was not marked stopped:\n{caplog.text[-3000:]}"
        assert holder is None, f"the claim was not released: held by {holder}"
        assert lease is None, f"the store lease was not released: held by {lease}"
        settings = get_settings()
        got = ownership.acquire(
            "scc-peer",
            limit=10,
            ttl=settings.workflow_claim_ttl,
            renew_interval=settings.workflow_claim_renew_interval,
            using="default",
        )
        assert set(got) == {wid}, "a peer could not claim the workflow at once"
