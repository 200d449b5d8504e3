"""Two admissions racing on one queue (two threads, two connections, the real database): the queue
lock makes the second count after the first committed, so concurrency 1 admits one run, not two.
The first admission is held between its counts and its writes (as an engine frozen there would be)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings

import weft_django as weft
from weft_django.flow import QueueConfig
from weft_django.models import Workflow
from weft_django.store import queues

pytestmark = pytest.mark.django_db(transaction=True)
ONE = QueueConfig("race", concurrency=1)


@override_settings(WEFT={"QUEUES": {"race": {"concurrency": 1}}})
def test_racing_admissions_admit_one_run_under_concurrency_one(monkeypatch):
    for i in range(2):
        weft.start("tests.queued", queue="race", id=f"race-{i}")
    counted = threading.Event()
    release = threading.Event()
    real = queues._free_slots

    def slow_first(engine_id, queue, limit, now, using):
        free = real(engine_id, queue, limit, now, using)
        if engine_id == "first":
            counted.set()
            release.wait(10)  # the first admission sits between its counts and its writes
        return free

    monkeypatch.setattr(queues, "_free_slots", slow_first)
    got: dict[str, dict[str, int]] = {}

    def admit(engine_id: str) -> None:
        try:
            got[engine_id] = queues.admit(engine_id, ONE, limit=10, ttl=timedelta(seconds=30), using="default")
        finally:
            connections.close_all()

    first = threading.Thread(target=admit, args=("first",))
    first.start()
    assert counted.wait(10)
    second = threading.Thread(target=admit, args=("second",))
    second.start()
    second.join(0.5)  # the second waits for the queue lock (it would admit race-1 at once without it)
    release.set()
    first.join(10)
    second.join(20)
    assert got["first"].keys() == {"race-0"} and got["second"] == {}
    assert Workflow.objects.filter(queue="race", status="running").count() == 1
