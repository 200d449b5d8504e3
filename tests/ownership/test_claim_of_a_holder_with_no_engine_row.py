"""A claim held by an engine id that has no Engine row, with an expiry further ahead than any renewal
sets (a hand edit: ``'infinity'``, a year ahead; or a row copied from another database): no heartbeat
can ever speak for its holder, so nothing but its expiry would free it, and with ``'infinity'`` that
never comes. It lapses as a dormant claim whose holder's heartbeat is old (ADR 0014): another engine
takes it over, and its workflow runs. A claim of a holder without a row whose expiry is within the TTL
(as a renewal sets it) is still kept by its expiry.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

import weft_django as weft
from weft_django.models import WorkflowClaim
from weft_django.store.claims import has_lapsed
from weft_django.store.clock import db_clock
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES = connection.vendor == "postgresql"
FAR = {True: "'infinity'", False: "'9999-12-31 00:00:00'"}
YEAR = {True: "now() + interval '365 days'", False: "datetime('now', '+365 days')"}
SOON = {True: "now() + interval '20 seconds'", False: "datetime('now', '+20 seconds')"}  # within the TTL (30s)


def _sql(statement: str, params: Any = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _held_by_a_ghost(workflow_id: str, expiry: str) -> None:
    """The workflow's claim held by 'ghost-engine' (no Engine row) until ``expiry``."""
    now = "now()" if POSTGRES else "datetime('now')"
    _sql(
        f"UPDATE {WorkflowClaim._meta.db_table} SET engine_id = 'ghost-engine', claimed_at = {now}, "
        f"expires_at = {expiry} WHERE workflow_id = %s",
        [workflow_id],
    )


@pytest.mark.parametrize("expiry", ["far", "a year"])
def test_a_claim_of_a_holder_with_no_engine_row_and_an_expiry_no_renewal_sets_is_taken_over(caplog, expiry):
    """Before: the claim was never taken (no engine row, so no old heartbeat; its expiry never comes):
    the workflow never ran (``ResultTimeoutError``)."""
    caplog.set_level(logging.WARNING, logger="weft_django")
    damaged = weft.start("tests.sum", args=[1, 2], id="damaged")
    _held_by_a_ghost("damaged", (FAR if expiry == "far" else YEAR)[POSTGRES])
    good = weft.start("tests.sum", args=[2, 3], id="good")
    run_until_idle(timeout=20)
    assert good.result(timeout=5) == {"total": 5}
    assert damaged.result(timeout=5) == {"total": 3}
    assert "took over workflow=damaged" in caplog.text and "previous=ghost-engine" in caplog.text, caplog.text


def test_a_claim_of_a_holder_with_no_engine_row_within_the_ttl_is_kept_by_its_expiry():
    """An expiry a renewal could have set (within the TTL): the holder may be an engine whose row was
    deleted while it ran (its heartbeat then fails, and it renews every claim with the TTL): kept."""
    weft.start("tests.sum", args=[1, 2], id="damaged")
    _held_by_a_ghost("damaged", SOON[POSTGRES])
    good = weft.start("tests.sum", args=[2, 3], id="good")
    run_until_idle(timeout=15)
    assert good.result(timeout=5) == {"total": 5}
    assert WorkflowClaim.objects.get(pk="damaged").engine_id == "ghost-engine"
    assert weft.get_handle("damaged").describe()["status"] == "running"


def test_the_readers_show_such_a_claim_lapsed():
    """The admin, ``weft list`` and the doctor read the same rule (store/claims/lapse.py)."""
    now, ttl = db_clock("default"), timedelta(seconds=30)
    assert has_lapsed(now + timedelta(days=365), None, now, ttl)
    assert not has_lapsed(now + timedelta(seconds=10), None, now, ttl)


LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s", "LEASE_WAIT_TIMEOUT": "6s"}


@pytest.mark.parametrize("expiry", ["far", "a year"])
def test_a_store_lease_of_a_holder_with_no_engine_row_and_an_expiry_no_renewal_sets_is_taken(expiry):
    """OWNERSHIP="lease", the same rule for the store-wide lease. Before: no engine could start
    (EngineLeaseAcquisitionTimeoutError), for ever."""
    with override_settings(WEFT=LEASE):
        run_until_idle(timeout=15)  # the mode marker and the lease row
        held_until = (FAR if expiry == "far" else YEAR)[POSTGRES]
        _sql(f"UPDATE weft_django_storelease SET engine_id = 'ghost-engine', expires_at = {held_until}")
        good = weft.start("tests.sum", args=[2, 3], id="good")
        run_until_idle(timeout=15)
        assert good.result(timeout=5) == {"total": 5}
