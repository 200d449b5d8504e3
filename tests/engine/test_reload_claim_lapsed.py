"""A workflow waiting to be loaded again must not be driven by an engine that lost its claim meanwhile.

After a refused or failed commit (``Engine.reload_batch``, ``_refused``, a failed pass) a workflow's
context is dropped and it waits in ``Engine._reload`` until a pass's load succeeds. Its claim is not
published for renewal while it waits (only resident and evicted claims are). Loads that keep failing
(a database error in the load's statement, injected here) for longer than the claim TTL and the takeover
grace let a peer take the claim over at a new epoch; the load that then succeeded brought the workflow
back at its old epoch, unchecked, and it was driven: its next step, a local activity (run on the loop
thread before the fenced commit), ran on the engine that had lost the claim. The local activity records
which engine held the claim as it ran; only this engine runs it, so each run must find it the holder.
``expired``: the claim is made to lapse at once (as under a frozen renewal thread), so the peer surely
takes it over and the engine must find it lost; else whether the peer can take it depends on the engine
keeping it renewed while its loads fail."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test import override_settings

import weft_django as weft
from tests.engine.ticking import tick_until
from tests.testapp.models import ActivityCall
from weft_django.conf import get_settings
from weft_django.engine import ownership
from weft_django.engine.engine import Engine
from weft_django.models import Step, WorkflowClaim
from weft_django.store.claims import expire_claims

pytestmark = pytest.mark.django_db(transaction=True)
# Takeover is due 1 s (the TTL) + 0.6 s (two renew intervals of grace) after the last renewal.
SHORT_CLAIMS = {"POLL_INTERVAL": "60s", "WORKFLOW_CLAIM_TTL": "1s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "300ms"}
LOAD = f"FROM {Step._meta.db_table} WHERE run_id"  # the load's steps statement (PostgreSQL's batch, SQLite's own)


@pytest.mark.parametrize("expired", [False, True], ids=["loads-failing", "expired"])
@override_settings(WEFT=SHORT_CLAIMS)
def test_a_workflow_whose_claim_a_peer_took_while_it_waited_to_be_reloaded_is_not_driven(
    expired: bool, caplog: pytest.LogCaptureFixture
) -> None:
    engine, wid = Engine("rlc-holder", concurrency=2), "rlc-0"
    engine.start()
    try:
        weft.start("tests.signal_then_local", id=wid)
        tick_until(engine, lambda: wid in engine.owned and engine.owned[wid].run.frontier is not None, "parked")
        for _ in range(3):
            engine.tick()
        engine.reload_batch([wid])  # a commit of its failed: its context is dropped, to be loaded again
        assert engine._reload == {wid: WorkflowClaim.objects.get(pk=wid).epoch}
        weft.signal(wid, "go", "payload")
        settings, failed, taken = get_settings(), [], {}

        def load_fails(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if LOAD in sql:
                failed.append(sql)
                raise OperationalError("injected: the load failed")
            return execute(sql, params, many, context)

        # The loads fail for three times the TTL and its grace; a peer takes the claim over once it may.
        deadline = time.monotonic() + 3 * (1.0 + 0.6)
        with connection.execute_wrapper(load_fails):
            while time.monotonic() < deadline and not taken:
                engine.tick()
                if expired:
                    expire_claims(None, [wid], "default")
                taken = ownership.acquire(
                    "rlc-peer",
                    limit=10,
                    ttl=settings.workflow_claim_ttl,
                    renew_interval=settings.workflow_claim_renew_interval,
                    using="default",
                    takeover=True,
                )
                time.sleep(0.05)
        assert failed, "no load was tried while it waited"
        tick_until(engine, lambda: not engine._reload, "the load going through")
        for _ in range(20):
            engine.tick()
        calls = ActivityCall.objects.filter(name="local_who", key__startswith=f"{wid}|")
        ran = list(calls.values_list("key", flat=True))
        by_non_owner = [key for key in ran if not key.endswith("holder=weft-rlc-holder")]
        assert by_non_owner == [], f"the local step ran in rlc-holder after rlc-peer took the claim {taken}: {ran}"
        if expired:
            assert taken and f"stopped driving workflow={wid} engine=rlc-holder" in caplog.text
        if taken:  # the peer shuts down: the workflow is claimed again and driven by its owner
            ownership.release("rlc-peer", {wid: epoch for wid, (epoch, _) in taken.items()}, "default")
            engine.claimer.scan_soon()  # its wake-up (SQLite sends none; POLL_INTERVAL is 60 s)
        tick_until(engine, lambda: weft.get_handle(wid).describe()["status"] == "completed", "its end by its owner")
        assert weft.get_handle(wid).result(timeout=1) == "payload"
        assert [key for key in calls.values_list("key", flat=True) if not key.endswith("holder=weft-rlc-holder")] == []
    finally:
        engine.shutdown()
