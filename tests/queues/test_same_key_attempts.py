"""After a reload at the same epoch, the stopped attempt may still be running while its workflow's new
context sends the same attempt again: two tasks with one key (run, seq, attempt, epoch). The thread
pool and the activity slots must tell them apart. Before the fix (found by a helper's review, session
17) the new task took the old one's place in both: no second thread was started (the new attempt
waited behind the old, maybe for ever), and the old attempt's slot was never released."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from django.utils import timezone

import weft_django as weft
from weft_django.conf import get_settings
from weft_django.engine.activities import AttemptTask
from weft_django.engine.executors import ActivityExecutors
from weft_django.models import ActivitySlot
from weft_django.registry import registry

pytestmark = pytest.mark.django_db(transaction=True)
OLD_MAY_RETURN, OLD_RUNS = threading.Event(), threading.Event()


@weft.activity(name="tests.same_key_work", concurrency=5)
def same_key_work(which: str) -> str:
    if which == "old":
        OLD_RUNS.set()
        OLD_MAY_RETURN.wait(20)
    return which


def test_two_tasks_with_one_key_each_get_a_thread_and_a_slot_released_on_their_own():
    OLD_MAY_RETURN.clear()
    OLD_RUNS.clear()
    definition = registry.activities["tests.same_key_work"]
    executors = ActivityExecutors("same-key", 2, lambda: None, lambda task, text: None, "default", get_settings())
    run_id = str(uuid.uuid4())

    def task(which: str) -> AttemptTask:
        args = json.dumps({"args": [which], "kwargs": {}})
        return AttemptTask("w-same-key", run_id, 1, 1, 7, definition, args, timezone.now(), None)

    old, new = task("old"), task("new")
    assert old.key == new.key
    try:
        executors.submit(old)
        assert OLD_RUNS.wait(10)
        old.control.request_stop("the engine reloads the workflow")  # still running: it cannot be interrupted
        executors.submit(new)
        outcome = executors.threads.outcomes.get(timeout=10)  # the new attempt runs beside the old one
        assert outcome.task is new and outcome.result == '"new"'
        assert executors.running == [old]
        OLD_MAY_RETURN.set()
        late = executors.threads.outcomes.get(timeout=10)
        assert late.task is old
        executors.poll(set())  # the pass looks at its slots
        assert not executors.running
        assert not ActivitySlot.objects.filter(released_at__isnull=True).exists(), "a slot was never released"
    finally:
        OLD_MAY_RETURN.set()
        executors.shutdown(5)
