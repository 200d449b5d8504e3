"""Queue admission and activity slots never wait on their advisory lock (PostgreSQL): an engine stopped
(SIGSTOP) while it holds a queue's or an activity's lock must not stall the others. Another session
holds the lock in an open transaction; ``admit`` and ``take_slot`` return at once without admitting or
taking anything (the test session's ``lock_timeout`` turns a wait, the old behaviour, into an error
instead of a hang); once the holder ends its transaction, they succeed."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test import override_settings

import weft_django as weft
from weft_django import conf
from weft_django.models import ActivitySlot, Workflow
from weft_django.store import queues
from weft_django.store.limits import SLOT_LOCKS, SlotRequest, take_slot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

WEFT = {"QUEUES": {"one": {"concurrency": 1}}, "POLL_INTERVAL": "50ms"}


class Holder:
    """A second session holding ``pg_advisory_xact_lock(namespace, hashtext(name))`` in an open transaction."""

    def __init__(self, namespace: int, name: str) -> None:
        self.connection = connections.create_connection("default")
        self.connection.ensure_connection()
        self.connection.set_autocommit(False)
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [namespace, name])

    def release(self) -> None:
        self.connection.rollback()
        self.connection.set_autocommit(True)
        self.connection.close()


def _bounded_waits() -> None:
    with connection.cursor() as cursor:  # session level: a lock wait errors out instead of hanging
        cursor.execute("SET lock_timeout = '3s'")
        cursor.execute("SET statement_timeout = '10s'")


@override_settings(WEFT=WEFT)
def test_admit_skips_a_queue_whose_lock_another_session_holds():
    weft.start("tests.queued", id="lock-q", queue="one")
    queue = conf.queues()["one"]
    _bounded_waits()
    holder = Holder(queues.QUEUE_LOCKS, "one")
    try:
        assert queues.admit("lock-engine", queue, limit=5, ttl=timedelta(seconds=30), using="default") == {}
        assert Workflow.objects.get(pk="lock-q").status == "pending"
    finally:
        holder.release()
    admitted = queues.admit("lock-engine", queue, limit=5, ttl=timedelta(seconds=30), using="default")
    assert list(admitted) == ["lock-q"]
    assert Workflow.objects.get(pk="lock-q").status == "running"


def test_take_slot_skips_an_activity_whose_lock_another_session_holds():
    request = SlotRequest(
        "tests.lock_activity", None, "lock-wf", str(uuid.uuid4()), 0, 1, 1, concurrency=2, rate=None, per_key=1
    )
    _bounded_waits()
    holder = Holder(SLOT_LOCKS, "tests.lock_activity")
    try:
        slot, why = take_slot("lock-engine", request, "default")
        assert (slot, why) == (None, "busy")
        assert not ActivitySlot.objects.exists()
    finally:
        holder.release()
    slot, why = take_slot("lock-engine", request, "default")
    assert slot is not None and why == ""
    assert ActivitySlot.objects.filter(pk=slot).exists()


def test_an_attempt_refused_for_a_held_activity_lock_waits_and_runs_once_it_is_free():
    """The dispatch path: an attempt whose slot was refused because another session holds the
    activity's lock is kept waiting in its engine (not failed, not dropped) and runs once it is free.
    (Not a fail-first test: the waiting version reached the same state after the engine session's
    lock_timeout; this one pins the retry of a "busy" refusal.)"""
    from weft_django.testing import running_engine, wait_for

    holder = Holder(SLOT_LOCKS, "tests.testapp.queue_workflows.limited_work")
    try:
        with running_engine("lock-dispatch-engine") as engine:
            handle = weft.start("tests.limited", args=[1, 0], id="lock-dispatch")
            wait_for(lambda: engine.executor.limiter.waiting, timeout=30, message="the attempt to wait for its slot")
            assert Workflow.objects.get(pk="lock-dispatch").status == "running"
            assert not ActivitySlot.objects.exists()
            holder.release()
            assert len(handle.result(timeout=30)) == 1
            assert ActivitySlot.objects.filter(workflow_id="lock-dispatch").count() == 1
    finally:
        if holder.connection.connection is not None:
            holder.release()
