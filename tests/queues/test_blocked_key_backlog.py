"""Admission reads past the runs whose concurrency key is in use instead of reading them and skipping
them: a backlog of one key longer than the admission looks at (PAGE * MAX_PAGES waiting runs) no longer
starves the runs behind it. Before the fix (found by a helper's review, session 17) an unkeyed run
behind 5,000 runs of a busy key was not admitted, with free slots."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django import conf
from weft_django.store import queues

pytestmark = pytest.mark.django_db(transaction=True)
TTL = timedelta(seconds=30)


@override_settings(WEFT={"QUEUES": {"k": {"concurrency": 10}}, "POLL_INTERVAL": "50ms"})
def test_runs_behind_a_long_backlog_of_a_busy_key_are_admitted(monkeypatch):
    monkeypatch.setattr(queues, "PAGE", 2)
    monkeypatch.setattr(queues, "MAX_PAGES", 1)
    queue = conf.queues()["k"]
    for i in range(3):
        weft.start("tests.queued_parks", id=f"busy-key-{i}", queue="k", concurrency_key="K")
    weft.start("tests.queued_parks", id="no-key", queue="k")
    got = set(queues.admit("e1", queue, limit=5, ttl=TTL, using="default"))
    got |= set(queues.admit("e1", queue, limit=5, ttl=TTL, using="default"))
    assert got == {"busy-key-0", "no-key"}
