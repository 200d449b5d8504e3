"""A queued run whose stored ``execution_timeout`` is damaged (hand-edited, a bad migration) so that
admission time plus it is no date (PostgreSQL and SQLite). Admission sets ``execution_deadline`` from
it; ``now + timeout`` raised OverflowError there, which is no DatabaseError, so every engine pass
failed: that queue, every other queue and every run without a queue stopped ("A row that cannot be
decoded stops that run, never the engine", docs/concepts.md). Now such a timeout counts as the
longest one weft accepts (``durations.MAX_DURATION``), as an API-given timeout could be."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings

import weft_django as weft
from weft_django.durations import MAX_DURATION
from weft_django.engine.engine import Engine
from weft_django.models import Workflow
from weft_django.testing import run_until_idle, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

DAYS = 20_000_000  # a timedelta (and a 64-bit microsecond count on SQLite), but no date once added to now


@override_settings(WEFT={"QUEUES": {"q": {"concurrency": 5}, "r": {}}, "POLL_INTERVAL": "50ms"})
def test_a_damaged_execution_timeout_stops_no_other_run():
    weft.start("tests.queued", queue="q", id="damaged", execution_timeout="1h")
    weft.start("tests.queued", queue="q", id="same-queue")
    weft.start("tests.queued", queue="r", id="other-queue")
    weft.start("tests.queued", id="no-queue")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "UPDATE weft_django_workflow SET execution_timeout = %s * interval '1 day' WHERE id = 'damaged'", [DAYS]
            )
        else:
            cursor.execute(
                "UPDATE weft_django_workflow SET execution_timeout = %s WHERE id = 'damaged'", [DAYS * 86_400 * 10**6]
            )
    assert Workflow.objects.get(pk="damaged").execution_timeout == timedelta(days=DAYS)
    run_until_idle(timeout=20)
    status = dict(Workflow.objects.values_list("id", "status"))
    assert status == {
        "damaged": "completed",
        "same-queue": "completed",
        "other-queue": "completed",
        "no-queue": "completed",
    }
    row = Workflow.objects.get(pk="damaged")
    assert row.execution_deadline == row.admitted_at + MAX_DURATION


@pytest.mark.postgres
@override_settings(WEFT={"QUEUES": {"q": {"concurrency": 5}}, "POLL_INTERVAL": "50ms"})
def test_a_stored_timeout_that_python_cannot_read_stops_no_other_run_of_its_queue():
    """An interval of more days than a timedelta holds (PostgreSQL's interval goes past it): reading
    it raised DataError in every admission, which the claimer logs and retries, so the damaged run,
    first in FIFO order, kept every other run of its queue waiting for ever."""
    weft.start("tests.queued", queue="q", id="unreadable", execution_timeout="1h")
    weft.start("tests.queued", queue="q", id="same-queue")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE weft_django_workflow SET execution_timeout = interval '1 day' * 1500000000 WHERE id = 'unreadable'"
        )
    run_until_idle(timeout=20)
    assert Workflow.objects.filter(pk="same-queue").values_list("status", flat=True).get() == "completed"
    deadline, admitted = Workflow.objects.filter(pk="unreadable").values_list("execution_deadline", "admitted_at").get()
    assert admitted is not None and deadline == admitted + MAX_DURATION


@pytest.mark.postgres
@override_settings(WEFT={"QUEUES": {"q": {}}, "POLL_INTERVAL": "50ms"})
def test_a_waiting_runs_start_time_that_python_cannot_read_stops_no_other_run_of_its_queue():
    """A start time before year 1 (PostgreSQL's timestamptz goes past a datetime): admission read each
    waiting run's created_at into Python for its page cursor, so every admission raised DataError and
    no run of the queue was admitted again."""
    weft.start("tests.queued", queue="q", id="unreadable")
    weft.start("tests.queued", queue="q", id="same-queue")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE weft_django_workflow SET created_at = timestamptz '0001-01-01 00:00:00+00' - interval '1 day' "
            "WHERE id = 'unreadable'"
        )
    engine = Engine("damaged-start")  # a real engine loop (run_until_idle's idle check reads the queue too)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: Workflow.objects.filter(pk="same-queue", status="completed").exists(), 20, message="done")
    finally:
        engine.request_stop()
        thread.join(timeout=20)
    assert Workflow.objects.filter(pk="same-queue").values_list("status", flat=True).get() == "completed"
