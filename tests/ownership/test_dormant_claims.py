"""Dormant claims (ADR 0014): an engine renews the claims of its evicted workflows with a long TTL and
rarely; its heartbeat keeps them. A claim has lapsed, and another engine takes it over, when its expiry
is more than the grace past or its holder's heartbeat is more than the TTL and the grace old: an engine
that dies with dormant claims loses them as promptly as an expired claim, a live one keeps them."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest

import weft_django as weft
from weft_django.engine import ownership, renewal
from weft_django.models import Engine, WorkflowClaim
from weft_django.store import engines
from weft_django.store.clock import db_clock
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
TTL, RENEW = timedelta(seconds=30), timedelta(seconds=5)
GRACE = RENEW * ownership.TAKEOVER_GRACE_MULTIPLIER


def _dormant(engine_id: str) -> tuple[str, int]:
    """A parked workflow held by ``engine_id`` with a dormant claim (renewed with the long TTL)."""
    handle = weft.start("tests.signals")
    engines.register_engine(engine_id, "automatic", "default")
    got = ownership.acquire(engine_id, limit=1, ttl=TTL, renew_interval=RENEW, using="default")
    epoch = got[handle.id][0]
    assert ownership.renew(engine_id, {handle.id: epoch}, TTL * renewal.DORMANT_TTL_MULTIPLIER, "default") == set()
    return handle.id, epoch


def _heartbeat_age(engine_id: str, age: timedelta) -> None:
    Engine.objects.filter(id=engine_id).update(heartbeat_at=db_clock("default") - age)


def _takeover(holders: list[str] | None = None) -> dict[str, tuple[int, str | None]]:
    return ownership.acquire(
        "dc-rescuer", limit=10, ttl=TTL, renew_interval=RENEW, using="default", takeover=True, holders=holders
    )


def test_a_dormant_claim_is_kept_while_its_holder_heartbeats_and_taken_once_the_heartbeat_lapsed():
    wid, epoch = _dormant("dc-holder")
    claim = WorkflowClaim.objects.get(pk=wid)
    assert claim.expires_at > db_clock("default") + TTL * (renewal.DORMANT_TTL_MULTIPLIER - 1)

    # A heartbeat older than the TTL but within the grace after it: nothing is taken (either scan).
    _heartbeat_age("dc-holder", TTL + GRACE - timedelta(seconds=3))
    assert _takeover() == {}
    assert _takeover(holders=["dc-holder"]) == {}
    assert WorkflowClaim.objects.get(pk=wid).engine_id == "dc-holder"

    # Past the TTL and the grace: taken over, at a new epoch, long before the claim's own expiry.
    _heartbeat_age("dc-holder", TTL + GRACE + timedelta(seconds=1))
    taken = _takeover()
    assert set(taken) == {wid} and taken[wid][0] > epoch and taken[wid][1] == "dc-holder"
    claim = WorkflowClaim.objects.get(pk=wid)
    assert claim.engine_id == "dc-rescuer" and claim.expires_at < db_clock("default") + TTL + timedelta(seconds=1)
    # The old holder's renewal finds it lost.
    assert ownership.renew("dc-holder", {wid: epoch}, TTL, "default") == {wid}


@pytest.mark.postgres
def test_the_frequent_scan_of_silent_holders_takes_a_dormant_claim_too():
    wid, _ = _dormant("dc-silent")
    kept, _ = _dormant("dc-alive")
    _heartbeat_age("dc-silent", TTL + GRACE + timedelta(seconds=1))
    assert engines.silent_engines(within=TTL, using="default") == ["dc-silent"]
    taken = _takeover(holders=["dc-silent"])
    assert set(taken) == {wid}
    assert WorkflowClaim.objects.get(pk=kept).engine_id == "dc-alive"


def test_an_engine_killed_with_dormant_claims_is_taken_over_before_they_expire(weft_engines):
    """A real engine evicts two of three parked workflows (MAX_RESIDENT_WORKFLOWS 1), renews their
    claims as dormant, and is killed; a second engine takes all three over within the TTL and the
    grace of its last heartbeat, not the dormant TTL, and the signals complete them."""
    fast = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "MAX_RESIDENT_WORKFLOWS": 1}
    handles = [weft.start("tests.signals", id=f"dc-e2e-{n}") for n in range(3)]
    ids = [h.id for h in handles]
    first = weft_engines("dc-first", weft=fast)
    ttl = timedelta(seconds=3)

    def dormant() -> int:
        far = db_clock("default") + ttl * 2
        return WorkflowClaim.objects.filter(pk__in=ids, engine_id="dc-first", expires_at__gt=far).count()

    wait_for(lambda: dormant() == 2, timeout=60, message="two evicted workflows with dormant claims")
    first.send(signal.SIGKILL)
    first.wait()
    latest_expiry = max(WorkflowClaim.objects.filter(pk__in=ids).values_list("expires_at", flat=True))

    weft_engines("dc-second", weft=fast)
    wait_for(
        lambda: set(WorkflowClaim.objects.filter(pk__in=ids).values_list("engine_id", flat=True)) == {"dc-second"},
        timeout=60,
        message="every claim taken over by the second engine",
    )
    assert db_clock("default") < latest_expiry  # taken through the heartbeat, not the claims' expiry
    for handle in handles:
        weft.signal(handle.id, "go", handle.id)
    assert [h.result(timeout=60) for h in handles] == ids


def test_an_engine_restarted_under_the_same_id_cuts_its_predecessors_dormant_claims_to_one_ttl():
    """The restarted process heartbeats under the old id, so the old dormant claims would lapse only by
    their long expiry: start-up cuts them to one TTL from now (taken over after TTL + grace, as before
    dormant claims); its other claims are left as they were."""
    from weft_django.engine.engine import Engine as WeftEngine

    wid, epoch = _dormant("dc-same")
    other, _ = _dormant("dc-other")
    engine = WeftEngine("dc-same")
    engine.start()
    try:
        ttl = engine.settings.workflow_claim_ttl
        cut = WorkflowClaim.objects.get(pk=wid)
        assert cut.engine_id == "dc-same" and cut.epoch == epoch
        assert cut.expires_at <= db_clock("default") + ttl
        assert WorkflowClaim.objects.get(pk=other).expires_at > db_clock("default") + TTL * 2
    finally:
        engine.shutdown()
