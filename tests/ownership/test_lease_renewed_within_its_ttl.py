"""OWNERSHIP="lease": the holder renews the store lease every LEASE_RENEW_INTERVAL, so it never lapses
while the holder runs.

The renewal thread ran its passes every WORKFLOW_CLAIM_RENEW_INTERVAL (5 s: the lease mode keeps the claim
defaults) and renewed the lease on each: with LEASE_TTL="3s" the lease stood expired for 2 s of every 5,
and past its takeover grace (2 LEASE_RENEW_INTERVALs) just as the next renewal was due. Any engine asking
for it then took it: a standby, or a deposed engine, which asks on every pass (engine/renewal.py
``StoreLease.hold``): under CPU load the renewal ran late often enough that
tests/ownership/test_lease_frozen_holder.py saw its thawed engine take the lease back.
"""

from __future__ import annotations

import time

import pytest

from weft_django.models import StoreLease
from weft_django.store.clock import db_clock
from weft_django.testing import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s"}


def test_the_lease_holder_keeps_its_lease_from_lapsing(weft_engines):
    holder = weft_engines("lrt-holder", weft=LEASE)
    wait_for(lambda: StoreLease.objects.filter(engine_id="lrt-holder").exists(), timeout=30, message="the lease")
    epoch = StoreLease.objects.get().epoch
    lapsed = []
    deadline = time.monotonic() + 12  # two and more passes of the claim renewal interval (5 s)
    while time.monotonic() < deadline:
        expires, now = StoreLease.objects.values_list("expires_at", flat=True).get(), db_clock("default")
        if expires < now:
            lapsed.append(now - expires)
        time.sleep(0.1)
    assert not lapsed, f"the held lease stood expired {len(lapsed)} times, up to {max(lapsed)} past its expiry"
    assert StoreLease.objects.get().epoch == epoch
    assert holder.stop() == 0
