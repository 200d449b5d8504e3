"""A schedule's held-back run (overlap="queue") is released only by an engine that knows its workflow
type: a queued workflow's run enters its queue. Before the fix (found by a helper's review, session
17) an engine without the type released it as a plain delayed start, and it ran outside its queue's
limits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django import conf
from weft_django.engine import ownership
from weft_django.engine.schedules import ScheduleFiring
from weft_django.models import Workflow
from weft_django.registry import registry
from weft_django.store import queues
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)
WEFT = {"QUEUES": {"tests-default": {"concurrency": 1}}, "POLL_INTERVAL": "50ms"}
TTL = timedelta(seconds=30)


@override_settings(WEFT=WEFT)
def test_an_engine_without_the_type_does_not_release_a_queued_workflows_held_back_run(monkeypatch):
    handle = weft.schedule("tests.queued_counter", id="release-unknown", every="1h", overlap="queue")
    first = handle.trigger()  # pending in its queue
    second = handle.trigger()  # held back by overlap="queue"
    queue = conf.queues()["tests-default"]
    assert list(queues.admit("e1", queue, limit=5, ttl=TTL, using="default")) == [first.id]
    weft.cancel(first.id)  # the schedule's slot frees
    weft.start("tests.queued_counter", id="release-unknown-holder")
    assert list(queues.admit("e1", queue, limit=5, ttl=TTL, using="default")) == ["release-unknown-holder"]
    monkeypatch.delitem(registry.latest, "tests.queued_counter")  # an engine of another deploy
    ScheduleFiring()._process("release-unknown", db_now("default"), "default")
    monkeypatch.undo()
    ownership.fire_delayed_starts("e2", limit=10, ttl=TTL, using="default")
    assert Workflow.objects.get(pk=second.id).status == "pending"  # not running past the full queue
    ScheduleFiring()._process("release-unknown", db_now("default"), "default")  # an engine that knows it
    assert Workflow.objects.get(pk=second.id).queue == "tests-default"
