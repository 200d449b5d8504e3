"""A rate-limited queue counts the runs it admitted within its window from their rows, so retention
keeps a run admitted within its queue's rate window (it is purged once the window has passed). Before
the fix (found by a helper's review, session 17) a purged run stopped counting: with retention shorter
than the rate's period, the queue admitted more than its rate."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django import conf
from weft_django.engine.retention import purge_expired
from weft_django.models import Workflow
from weft_django.store import queues
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)
TTL = timedelta(seconds=30)


@override_settings(WEFT={"QUEUES": {"r": {"rate": "1/d"}}, "POLL_INTERVAL": "50ms"})
def test_a_run_admitted_within_its_queues_rate_window_is_kept_until_the_window_passes():
    queue = conf.queues()["r"]
    weft.start("tests.queued_parks", id="rate-r1", queue="r")
    assert list(queues.admit("e1", queue, limit=5, ttl=TTL, using="default")) == ["rate-r1"]
    weft.cancel("rate-r1")
    now = db_now("default") + timedelta(seconds=1)
    assert purge_expired({"cancelled": timedelta(0)}, "default", now=now) == (0, False)
    weft.start("tests.queued_parks", id="rate-r2", queue="r")
    assert queues.admit("e1", queue, limit=5, ttl=TTL, using="default") == {}  # one a day
    later = db_now("default") + timedelta(days=1, seconds=1)
    assert purge_expired({"cancelled": timedelta(0)}, "default", now=later)[0] == 1
    assert not Workflow.objects.filter(pk="rate-r1").exists()
