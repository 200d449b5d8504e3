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


@override_settings(WEFT={"QUEUES": {"p": {"priorities": True}}, "POLL_INTERVAL": "50ms"})
def test_pages_past_a_skipped_key_keep_priority_start_and_id_order(monkeypatch):
    """The page cursor (priority, start time, id) over several pages: runs sharing a start time (one
    start_many on PostgreSQL) and priorities, keys repeated within a page, all in admission order."""
    monkeypatch.setattr(queues, "PAGE", 2)
    keys = {"r0": "A", "r1": "A", "r2": "B", "r3": "B", "r4": None, "r5": "C", "r6": "A", "r7": None}
    priorities = {"r5": 1, "r7": 1}
    weft.start_many(
        weft.StartRequest("tests.queued_parks", id=wid, queue="p", concurrency_key=key, priority=priorities.get(wid, 0))
        for wid, key in keys.items()
    )
    weft.start("tests.queued_parks", id="r8", queue="p", concurrency_key="D")  # a later start time
    assert queues._choose("p", 10, "default") == ["r0", "r2", "r4", "r8", "r5", "r7"]
    assert queues._choose("p", 3, "default") == ["r0", "r2", "r4"]
