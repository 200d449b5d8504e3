"""A workflow waiting to be reloaded whose claim row a user's transaction keeps locked: the engine's
other passes do not each wait for that row.

Since d490f8f a reload's claim that the renewal skipped (its row held by another transaction) waits in
``Engine._reload`` for a later pass instead of being loaded (tests/engine/test_reload_claim_row_held.py).
Every later pass renewed it again with the plain UPDATE, which waits up to PLAIN_LOCK_WAIT_MS for the
row before skipping it: while a user's transaction kept the row, every pass of the engine, whatever it
served, took that wait. Now a claim skipped once is renewed again only in the form that skips held rows
at once. The waits are counted here (the renewal statements that gave up on the lock), not timed."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

import weft_django as weft
from tests.engine.ticking import tick_until
from weft_django.engine.engine import Engine
from weft_django.models import WorkflowClaim

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@override_settings(WEFT={"POLL_INTERVAL": "60s"})
def test_passes_do_not_each_wait_for_a_reload_claim_row_a_user_keeps_locked() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    engine, held = Engine("rlw-holder", concurrency=2), "rlw-0"
    engine.start()
    locked, release = threading.Event(), threading.Event()

    def user_transaction() -> None:  # a user's open transaction holding the claim row (a cancel in atomic())
        try:
            with transaction.atomic():
                list(WorkflowClaim.objects.select_for_update().filter(pk=held))
                locked.set()
                release.wait(60)
        finally:
            connections.close_all()

    user = threading.Thread(target=user_transaction, daemon=True)
    waits: list[str] = []

    def counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        try:
            return execute(sql, params, many, context)
        except Exception as exc:
            if "lock timeout" in str(exc) or "lock_timeout" in str(exc) or "canceling statement" in str(exc):
                waits.append(sql[:60])
            raise

    try:
        weft.start("tests.signal_then_local", id=held)
        tick_until(engine, lambda: held in engine.owned and engine.owned[held].run.frontier, "parked")
        engine.reload_batch([held])  # a commit of its failed: it waits to be loaded again
        user.start()
        assert locked.wait(10)
        with connection.execute_wrapper(counting):
            for _ in range(10):
                engine.tick()
        assert held in engine._reload and held not in engine.owned, "loaded while its row was held"
        assert len(waits) <= 1, f"{len(waits)} of 10 passes waited for the held claim row: {waits}"
        release.set()
        user.join(10)
        weft.signal(held, "go", "payload")
        tick_until(engine, lambda: weft.get_handle(held).describe()["status"] == "completed", "its end")
        assert weft.get_handle(held).result(timeout=1) == "payload"
    finally:
        release.set()
        engine.shutdown()
