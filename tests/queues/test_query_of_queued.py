"""query() of a run waiting in its queue (PostgreSQL and SQLite): its timeout says the run waits for
its queue's admission, not that it is a delayed start (which it cannot be: a queued start refuses
start_after / start_at)."""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft

pytestmark = pytest.mark.django_db(transaction=True)

WEFT = {"QUEUES": {"one": {"concurrency": 1}}, "POLL_INTERVAL": "50ms"}


@override_settings(WEFT=WEFT)
def test_a_query_of_a_queued_run_says_it_waits_in_its_queue():
    handle = weft.start("tests.queued", queue="one", id="q-query")
    with pytest.raises(weft.QueryTimeoutError) as raised:
        handle.query("anything", timeout="300ms")
    message = str(raised.value)
    assert 'waiting in queue "one"' in message, message
    assert "delayed start" not in message, message


def test_a_query_of_a_delayed_start_still_says_so():
    handle = weft.start("tests.queued", id="delayed-query", start_after="1h")
    with pytest.raises(weft.QueryTimeoutError, match="delayed start"):
        handle.query("anything", timeout="300ms")
