"""A user's open transaction holding the engine row (SELECT ... FOR UPDATE) stops its heartbeat
(``heartbeat_engine`` skips a held row rather than stall renewal). The engine is alive and renews its
claims all the while: no other engine may take them over (a false lapse), resident or dormant. Its
shutdown does not wait for the row either (it is left unmarked)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings

import weft_django as weft
from tests.engine.locked import Held, row_lock
from tests.engine.test_commit_locks import holding
from weft_django.models import Engine, WorkflowClaim
from weft_django.store.clock import db_clock
from weft_django.testing import running_engine, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "MAX_RESIDENT_WORKFLOWS": 1}


def test_claims_of_a_live_engine_whose_row_a_user_holds_are_not_taken_over(weft_engines):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    ids = [weft.start("tests.signals", id=f"erl-{n}").id for n in range(3)]
    weft_engines("erl-holder", weft=FAST)

    def dormant() -> int:
        far = db_clock("default") + timedelta(seconds=6)
        return WorkflowClaim.objects.filter(pk__in=ids, engine_id="erl-holder", expires_at__gt=far).count()

    wait_for(lambda: dormant() == 2, timeout=60, message="one resident and two dormant claims")
    weft_engines("erl-peer", weft=FAST)
    with holding("SELECT 1 FROM weft_django_engine WHERE id = %s FOR UPDATE", ["erl-holder"], hold_at_most=40):
        time.sleep(12)  # TTL 3 s + grace 2 s, twice over: the peer's takeover scan runs every second
        holders = dict(WorkflowClaim.objects.filter(pk__in=ids).values_list("workflow_id", "engine_id"))
    assert holders == dict.fromkeys(ids, "erl-holder"), f"claims of a live engine taken over: {holders}"
    for wid in ids:
        weft.signal(wid, "go", wid)
    assert [weft.get_handle(wid).result(timeout=60) for wid in ids] == ids


@override_settings(WEFT={"WORKFLOW_CLAIM_TTL": "60s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "100ms"})
def test_an_engine_whose_row_a_user_holds_stops_without_waiting_for_it(caplog):
    """Shutdown marks the engine row stopped with a plain UPDATE: held by a user's open transaction it
    waited out the session's lock_timeout (half the TTL), failed, and was tried again over a new
    connection: a stopping engine outlived its drain by a whole TTL. Now the row is left unmarked."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    weft.start("tests.signals", id="erl-parked")
    held = None
    try:
        with running_engine("erl-stopping"):
            wait_for(lambda: WorkflowClaim.objects.filter(pk="erl-parked", engine_id="erl-stopping").exists(), 20)
            held = Held(*row_lock("engine", "id", "erl-stopping"), hold_at_most=120)
        assert not held.released.is_set(), "the engine stopped only once the user's transaction let its row go"
        assert WorkflowClaim.objects.get(pk="erl-parked").engine_id is None  # released: peers take it at once
        assert "engine row left unmarked at shutdown engine=erl-stopping" in caplog.text
    finally:
        if held is not None:
            held.let_go()
    assert Engine.objects.get(pk="erl-stopping").stopped_at is None
