"""A workflow waiting to be reloaded whose claim row a peer's takeover holds at the reload's renewal.

``ownership.held_to_load`` renews the claims of the workflows waiting in ``Engine._reload`` before their
load (tests/engine/test_reload_claim_lapsed.py). Its statement never waits long for a row another
transaction holds (PLAIN_LOCK_WAIT_MS, then the form that skips locked rows), so one held row stalls
neither the pass nor the other workflows' renewal. But the skipped claim was then only read, and a read
shows the claim as it was before the uncommitted takeover: still this engine's. The load went on, and
once the peer's takeover committed, the workflow's next step, a local activity (run on the loop thread
before the fenced commit), ran on the engine that had just lost the claim. Its fenced commit was then
refused and the new owner ran the step again: one step, run by both engines, committed once.

The interleaving is forced: a peer's takeover statement runs in a transaction left open on its own
connection (the row lock a takeover statement holds while it commits), and commits right after the
engine's renewal statement returned, before its load. The local activity records which engine held
the claim as it ran."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

import weft_django as weft
from tests.engine.ticking import tick_until
from tests.testapp.models import ActivityCall
from weft_django.conf import get_settings
from weft_django.engine import ownership
from weft_django.engine.engine import Engine
from weft_django.models import Step, Workflow, WorkflowClaim
from weft_django.store import claims
from weft_django.store.claims import expire_claims

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
SHORT_CLAIMS = {"POLL_INTERVAL": "60s", "WORKFLOW_CLAIM_TTL": "1s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "300ms"}


@override_settings(WEFT=SHORT_CLAIMS)
def test_a_reload_whose_claim_row_a_peers_takeover_holds_is_not_driven_by_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    engine, held, free = Engine("rlh-holder", concurrency=2), "rlh-0", "rlh-1"
    engine.start()
    locked, commit_now, committed = threading.Event(), threading.Event(), threading.Event()
    taken: dict[str, tuple[int, str | None]] = {}
    try:
        for wid in (held, free):
            weft.start("tests.signal_then_local", id=wid)
        parked = lambda: all(w in engine.owned and engine.owned[w].run.frontier for w in (held, free))  # noqa: E731
        tick_until(engine, parked, "parked")
        engine.reload_batch([held, free])  # a commit of theirs failed: both wait to be loaded again
        old_epoch = WorkflowClaim.objects.get(pk=held).epoch
        assert engine._reload == {held: old_epoch, free: WorkflowClaim.objects.get(pk=free).epoch}
        for wid in (held, free):
            weft.signal(wid, "go", "payload")
        expire_claims(None, [held], "default")  # its claim lapsed while its loads failed: a peer may take it
        settings = get_settings()

        def peer_takes_over() -> None:  # the takeover statement, its transaction still open
            try:
                with transaction.atomic():
                    taken.update(
                        ownership.acquire(
                            "rlh-peer",
                            limit=10,
                            ttl=settings.workflow_claim_ttl,
                            renew_interval=settings.workflow_claim_renew_interval,
                            using="default",
                            takeover=True,
                        )
                    )
                    locked.set()
                    commit_now.wait(30)
            finally:
                committed.set()
                connections.close_all()

        peer = threading.Thread(target=peer_takes_over, daemon=True)
        peer.start()
        assert locked.wait(10) and set(taken) == {held}, f"the peer's takeover did not lock the claim: {taken}"

        real, returned_while_locked = claims.renew_each, []

        def renewal_then_takeover_commits(engine_id: str, owned: dict[str, int], *args: Any, **kwargs: Any) -> Any:
            result = real(engine_id, owned, *args, **kwargs)
            if engine_id == "rlh-holder" and held in owned and not commit_now.is_set():
                returned_while_locked.append(not committed.is_set())
                commit_now.set()  # the takeover commits after the renewal, before the load
                assert committed.wait(10)
            return result

        monkeypatch.setattr(claims, "renew_each", renewal_then_takeover_commits)
        engine.tick()
        assert returned_while_locked == [True], "the reload's renewal waited for the row the takeover held"
        # Loaded in that pass: still driven, or already ended (its load read the signal, which its wait
        # then took in the same pass, engine/signal_delivery.deliver_known, and its local step ran).
        loaded = free in engine.owned or Workflow.objects.filter(pk=free, status="completed").exists()
        assert loaded, "the other workflow waiting to be reloaded was not loaded in that pass"
        for _ in range(20):
            engine.tick()
        monkeypatch.undo()
        calls = ActivityCall.objects.filter(name="local_who", key__startswith=f"{held}|")
        ran = list(calls.values_list("key", flat=True))
        by_non_owner = [key for key in ran if not key.endswith("holder=weft-rlh-holder")]
        assert by_non_owner == [], f"the local step ran in rlh-holder after rlh-peer took the claim {taken}: {ran}"
        assert held not in engine.owned and held not in engine._reload, "rlh-holder still drives it"

        # The peer shuts down: the workflow is claimed again and driven by one engine, its step run once.
        ownership.release("rlh-peer", {wid: epoch for wid, (epoch, _) in taken.items()}, "default")
        engine.claimer.scan_soon()
        tick_until(engine, lambda: weft.get_handle(held).describe()["status"] == "completed", "its end by its owner")
        assert weft.get_handle(held).result(timeout=1) == "payload"
        assert calls.count() == 1, list(calls.values_list("key", flat=True))
        assert Step.objects.filter(workflow_id=held, name__contains="local_who").count() == 1
        tick_until(engine, lambda: weft.get_handle(free).describe()["status"] == "completed", "the other's end")
    finally:
        commit_now.set()
        engine.shutdown()
