"""The takeover scan reads the claims of silent engines only (issue 16): between full scans, an
expired claim of an engine that still heartbeats is left alone, one of a silent engine is taken."""

from __future__ import annotations

from datetime import timedelta

import pytest

import weft_django as weft
from weft_django.conf import get_settings
from weft_django.engine import ownership
from weft_django.engine.claimer import FULL_TAKEOVER_EVERY, Claimer
from weft_django.models import Engine, WorkflowClaim
from weft_django.store import engines
from weft_django.testing import expire_claims

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
TTL, RENEW = timedelta(seconds=30), timedelta(seconds=5)


def hold(engine_id: str) -> str:
    handle = weft.start("tests.signals")
    engines.register_engine(engine_id, "automatic", "default")
    got = ownership.acquire(engine_id, limit=1, ttl=TTL, renew_interval=RENEW, using="default")
    assert set(got) == {handle.id}
    return handle.id


def test_only_silent_engines_claims_are_read_between_full_scans():
    live, dead = hold("ts-live"), hold("ts-dead")
    expire_claims("ts-live")
    expire_claims("ts-dead")
    Engine.objects.filter(id="ts-dead").update(heartbeat_at="2000-01-01T00:00:00Z")
    assert engines.silent_engines(within=TTL, using="default") == ["ts-dead"]
    claimer = Claimer("ts-rescuer", get_settings(), "default", lambda *a: None)
    claimer.last_full_takeover_scan = 1000.0  # a full scan ran just now
    taken = claimer._take_lapsed(clock=1000.0)
    assert set(taken) == {dead}
    assert WorkflowClaim.objects.get(pk=live).engine_id == "ts-live"  # left to the full scan
    every = get_settings().workflow_claim_renew_interval.total_seconds() * FULL_TAKEOVER_EVERY
    full = claimer._take_lapsed(clock=1000.0 + every + 1)
    assert set(full) == {live}


def test_no_silent_engine_no_scan(django_assert_num_queries):
    hold("ts-only")
    claimer = Claimer("ts-other", get_settings(), "default", lambda *a: None)
    claimer.last_full_takeover_scan = 1000.0
    with django_assert_num_queries(2):  # the clock and the engine rows; no claim is read
        assert claimer._take_lapsed(clock=1000.0) == {}
