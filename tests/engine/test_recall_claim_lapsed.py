"""A recall of an evicted workflow must not drive it on an engine that is about to lose its claim.

A dormant claim (ADR 0014) lapses when its holder's heartbeat stalls (a freeze, a stalled renewal);
the recall read the claim (still this engine's, at its epoch) and loaded the workflow, and a peer's
takeover of the lapsed claim between that read and the load let the old holder deliver the signal and
run the next step, a local activity (in the engine's process, before its fenced commit), as a
non-owner. The takeover is forced into that window here: the peer takes the claim just before the
recall's load. The local activity records which engine held the claim as it ran."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from tests.engine.ticking import tick_until
from tests.testapp.models import ActivityCall
from weft_django.conf import get_settings
from weft_django.engine import ownership
from weft_django.engine.engine import Engine
from weft_django.models import WorkflowClaim
from weft_django.store.claims import expire_claims
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)
ONE_RESIDENT = {"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1}


@override_settings(WEFT=ONE_RESIDENT)
def test_a_recalled_workflow_whose_lapsed_claim_a_peer_takes_is_not_driven(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine("rcl-holder", concurrency=2)
    engine.start()
    try:
        for n in range(2):
            weft.start("tests.signal_then_local", id=f"rcl-{n}")
        tick_until(engine, lambda: len(engine.residency.evicted) == 1, "one evicted")
        [wid] = engine.residency.evicted
        expire_claims(None, [wid], "default")  # its holder stalled: the claim has lapsed, not yet taken
        settings, real, taken = get_settings(), engine.loader.load, []

        def peer_takes_it_first(claimed: dict[str, int], *args: Any, **kwargs: Any) -> None:
            if wid in claimed and not taken:
                taken.append(
                    ownership.acquire(
                        "rcl-peer",
                        limit=10,
                        ttl=settings.workflow_claim_ttl,
                        renew_interval=settings.workflow_claim_renew_interval,
                        using="default",
                        takeover=True,
                    )
                )
            real(claimed, *args, **kwargs)

        monkeypatch.setattr(engine.loader, "load", peer_takes_it_first)
        weft.signal(wid, "go", "payload")
        engine.residency.sweep(engine, db_now())  # the recall (SQLite has no wake-up; POLL_INTERVAL is 60 s)
        tick_until(engine, lambda: taken and not engine._reload, "the recall's load")
        for _ in range(20):
            engine.tick()
        holder = WorkflowClaim.objects.get(pk=wid).engine_id
        calls = ActivityCall.objects.filter(name="local_who", key__startswith=f"{wid}|")
        ran = list(calls.values_list("key", flat=True))
        by_non_owner = [key for key in ran if not key.endswith("holder=weft-rcl-holder")]
        assert by_non_owner == [], f"the local step ran in rcl-holder while {holder} held the claim: {ran}"
        tick_until(engine, lambda: weft.get_handle(wid).describe()["status"] == "completed", "its end by its owner")
        assert calls.count() == 1 and weft.get_handle(wid).result(timeout=1) == "payload"
    finally:
        engine.shutdown()
