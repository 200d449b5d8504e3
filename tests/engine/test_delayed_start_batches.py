"""Delayed starts send no wake-up: the maintenance scan fires them, at most CLAIM_BATCH_SIZE at a time.
A full batch looks again on the next pass instead of waiting for the next maintenance pass."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.store.clock import db_now
from weft_django.testing import Clock

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(WEFT={"CLAIM_BATCH_SIZE": 2, "POLL_INTERVAL": "10s"})
def test_a_full_batch_of_delayed_starts_fires_the_next_batch_on_the_next_pass():
    for i in range(5):
        weft.start("tests.sum", args=[i, 1], id=f"delayed-{i}", start_at=db_now() + timedelta(seconds=30))
    Clock().advance(60)
    engine = Engine("delayed-batches")
    engine.start()
    try:
        fired = [len(engine.claimer.claim(force=False, scan=True))]  # the maintenance pass: 2 of 5
        fired += [len(engine.claimer.claim(force=False, scan=False)) for _ in range(3)]
    finally:
        engine.shutdown()
    assert fired == [2, 2, 1, 0]
