"""The backlog bound (engine/claimer.py) throttles new claims only where another engine would take
them. Under OWNERSHIP="lease" one engine (the store-lease holder) drives every workflow: the others
are standbys that heartbeat (renewal thread) but never claim, so for the bound they must not count as
"another engine is live" -- otherwise the one driving engine, once its threads have a backlog, starts
nothing new (not even a workflow that needs no thread) until a thread frees, unlike a single engine.
And a wake-up pass the throttle holds back must not count as the acquire scan."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from weft_django.conf import get_settings
from weft_django.engine import claimer as claimer_module
from weft_django.engine import ownership
from weft_django.engine.claimer import Claimed, Claimer


@pytest.fixture
def acquired(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A saturated claimer's world with a live peer: each acquire of unheld workflows is recorded, and
    nothing else touches the database."""
    calls: list[bool] = []

    def acquire_free(self: Claimer, into: Claimed) -> dict[str, tuple[int, str | None]]:
        calls.append(True)
        return {}

    monkeypatch.setattr(Claimer, "_acquire_free", acquire_free)
    monkeypatch.setattr(Claimer, "_admit", lambda self: {})
    monkeypatch.setattr(Claimer, "_detect_second_instance", lambda self: None)
    monkeypatch.setattr(Claimer, "_take_lapsed", lambda self, clock: {})
    monkeypatch.setattr(ownership, "take_over_from_others", lambda *a, **k: {})
    monkeypatch.setattr(ownership, "fire_delayed_starts", lambda *a, **k: {})
    monkeypatch.setattr(claimer_module.engines, "other_live_engines", lambda *a, **k: ["peer"])
    return calls


def _saturated(engine_id: str) -> Claimer:
    return Claimer(engine_id, get_settings(), "default", lambda *a: None, saturated=lambda: True)


@override_settings(WEFT={"OWNERSHIP": "lease"})
def test_under_the_store_lease_a_standby_does_not_hold_back_the_holders_claims(acquired):
    _saturated("holder").claim(force=True, scan=False)  # a wake-up named a new workflow
    assert acquired, "the lease holder claimed nothing: a heartbeating standby counted as an engine with room"


def test_a_throttled_engine_acquires_at_the_next_maintenance_pass_whatever_wake_ups_came_between(acquired):
    claimer = _saturated("busy")
    claimer.last_claim_scan = time.monotonic() - 60  # the last acquire scan was long ago
    claimer.claim(force=True, scan=False)  # a wake-up: held back
    assert acquired == []
    claimer.claim(force=False, scan=True)  # the maintenance pass right after
    assert acquired == [True]
