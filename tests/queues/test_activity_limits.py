"""Activity limits across engines: ``@weft.activity(concurrency=2)`` holds across two engine subprocesses
(by the activities' own records), ``rate="5/s"`` in every one-second window, one attempt per
``concurrency_key`` at a time; bad limits are definition errors."""

from __future__ import annotations

import datetime as dt

import pytest

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import ActivitySlot, Workflow
from weft_django.testing import run_until_idle, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
# No takeover is meant here: a claim TTL a loaded 2-core CI machine cannot starve past (with 3 s a late
# renewal let the other engine take a workflow over and run its attempts beside the first's, the
# documented at-least-once overlap, and the limit looked exceeded).
FAST = {"WORKFLOW_CLAIM_TTL": "15s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "100ms"}


def _most_at_once(start: str, end: str, group=lambda key: "") -> dict[str, int]:
    """Per group of keys: the most intervals (start row to the next end row of the same key) open at once."""
    rows = ActivityCall.objects.filter(name__in=[start, end]).order_by("created_at", "id").values_list("name", "key")
    open_now: dict[str, int] = {}
    most: dict[str, int] = {}
    for name, key in rows:
        g = group(key)
        open_now[g] = open_now.get(g, 0) + (1 if name == start else -1)
        most[g] = max(most.get(g, 0), open_now[g])
    return most


@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": -1}, "concurrency"),
        ({"rate": "fast"}, "rate"),
        ({"rate": "0/s"}, "rate"),
        ({"concurrency_key": 7}, "concurrency_key"),
    ],
)
def test_bad_activity_limits_are_definition_errors(options, word):
    with pytest.raises(weft.WorkflowDefinitionError, match=word):

        @weft.activity(name=f"tests.bad_limits_{word}", **options)
        def bad() -> None: ...

    from weft_django.registry import registry

    assert f"tests.bad_limits_{word}" not in registry.activities


@pytest.mark.postgres
@pytest.mark.subprocess
def test_concurrency_two_across_two_engines(weft_engines):
    for name in "ab":
        weft_engines(f"al-{name}", "--concurrency", "8", weft=FAST)
    ids = [weft.start("tests.limited", args=[4, 0.3], id=f"lim-{i}").id for i in range(3)]
    wait_for(
        lambda: Workflow.objects.filter(id__in=ids, status="completed").count() == 3,
        timeout=50,
        message="the limited workflows completed",
    )
    assert _most_at_once("a-start", "a-end") == {"": 2}
    assert ActivityCall.objects.filter(name="a-start").count() == 12
    assert not ActivitySlot.objects.filter(released_at__isnull=True).exists()


@pytest.mark.postgres
@pytest.mark.subprocess
def test_rate_five_per_second_across_two_engines(weft_engines):
    for name in "ab":
        weft_engines(f"ar-{name}", "--concurrency", "8", weft=FAST)
    ids = [weft.start("tests.rated", args=[10], id=f"rate-{i}").id for i in range(2)]
    wait_for(
        lambda: Workflow.objects.filter(id__in=ids, status="completed").count() == 2,
        timeout=50,
        message="the rated workflows completed",
    )
    taken = sorted(ActivitySlot.objects.filter(activity__endswith="rated_work").values_list("acquired_at", flat=True))
    assert len(taken) == 20
    second = dt.timedelta(seconds=1)
    assert max(sum(1 for a in taken if t <= a < t + second) for t in taken) == 5


def test_one_charge_per_customer_at_a_time():
    handle = weft.start("tests.charges", args=[["ann", "bob", "ann", "bob", "ann"], 0.1])
    run_until_idle(concurrency=8)
    assert sorted(handle.result(timeout=5)) == ["ann", "ann", "ann", "bob", "bob"]
    assert _most_at_once("c-start", "c-end", group=lambda key: key) == {"ann": 1, "bob": 1}
    started = list(
        ActivityCall.objects.filter(name="c-start").order_by("created_at", "id").values_list("key", flat=True)
    )
    assert started[:2] in (["ann", "bob"], ["bob", "ann"])  # the two customers ran side by side


def test_a_slot_stops_counting_when_its_claim_is_taken_over():
    from datetime import timedelta

    from weft_django.engine import ownership
    from weft_django.flow import parse_rate
    from weft_django.store.claims import expire_claims
    from weft_django.store.limits import SlotRequest, take_slot

    handle = weft.start("tests.limited", args=[1, 0.0], id="slot-1")
    ttl, renew = timedelta(seconds=30), timedelta(seconds=5)
    got = ownership.acquire("frozen", limit=10, ttl=ttl, renew_interval=renew, using="default")
    epoch = got["slot-1"][0]
    run_id = str(handle.describe()["run_id"])

    def ask(engine: str, at_epoch: int, seq: int) -> tuple[int | None, str]:
        request = SlotRequest("tests.limit_probe", None, "slot-1", run_id, seq, 1, at_epoch, 1, None, 1)
        return take_slot(engine, request, "default")

    assert ask("frozen", epoch, 0)[0] is not None
    assert ask("frozen", epoch, 1) == (None, "concurrency")  # concurrency 1: the first slot counts
    expire_claims("frozen", None, "default")
    taken = ownership.acquire("rescuer", limit=10, ttl=ttl, renew_interval=renew, using="default", takeover=True)
    assert ask("rescuer", taken["slot-1"][0], 0)[0] is not None  # the frozen engine's slot no longer counts
    rate = SlotRequest("tests.rate_probe", None, "slot-1", run_id, 0, 1, epoch, None, parse_rate("1/m"), 1)
    assert take_slot("x", rate, "default")[0] is not None and take_slot("x", rate, "default") == (None, "rate")


def test_per_call_concurrency_key_option():
    from tests.testapp.queue_workflows import charge

    fixed = charge.options(concurrency_key="cust-9")
    assert fixed.limits.key == "cust-9" and charge.limits.key is not fixed.limits.key
    with pytest.raises(weft.WorkflowDefinitionError):
        charge.options(concurrency=0)


@pytest.mark.parametrize(
    "options",
    [{"concurrency": 2}, {"rate": "5/s"}, {"concurrency_key": "acct"}],
)
def test_local_activity_with_limits_is_a_definition_error(options):
    """A local activity runs in the engine's loop, outside the limiter: the combination is refused."""
    word = next(iter(options))
    with pytest.raises(weft.WorkflowDefinitionError, match=rf"local=True cannot be combined with {word}="):

        @weft.activity(name=f"tests.local_limits_{word}", local=True, **options)
        def bad() -> None: ...

    from weft_django.registry import registry

    assert f"tests.local_limits_{word}" not in registry.activities


@pytest.mark.parametrize(
    ("base", "override"),
    [({"local": True}, {"concurrency": 2}), ({"concurrency": 2}, {"local": True}), ({"local": True}, {"rate": "1/s"})],
)
def test_local_activity_options_with_limits_is_a_definition_error(base, override):
    @weft.activity(name=f"tests.local_opts_{next(iter(base))}_{next(iter(override))}", **base)
    def fine() -> None: ...

    with pytest.raises(weft.WorkflowDefinitionError, match="local=True"):
        fine.options(**override)


def test_a_slot_is_released_before_its_outcome_is_handled():
    """The slot of an attempt whose outcome the loop takes is released in that same pass, before the
    outcome's step (and maybe the run's end) is committed: it never outlives the run it served. Before
    the fix, an outcome that landed between the pass's slot check and ``take_outcomes`` left its slot
    held until the next maintenance pass (seen as a flaky cross-engine test)."""
    import json
    import threading
    import uuid

    from django.utils import timezone

    from weft_django.conf import get_settings
    from weft_django.engine.activities import AttemptTask
    from weft_django.engine.executors import ActivityExecutors
    from weft_django.registry import registry

    definition = registry.activities["tests.testapp.queue_workflows.limited_work"]
    done = threading.Event()
    executors = ActivityExecutors("slot-engine", 2, done.set, lambda task, text: None, "default", get_settings())
    try:
        args = json.dumps({"args": [0.2]})
        task = AttemptTask("w-slot", str(uuid.uuid4()), 1, 1, 1, definition, args, timezone.now(), None)
        executors.submit(task)
        assert list(ActivitySlot.objects.filter(released_at__isnull=True).values_list("workflow_id", flat=True)) == [
            "w-slot"
        ]
        executors.poll(set())  # the pass looks at its slots while the attempt still runs
        assert done.wait(10)
        assert executors.busy  # nothing runs, but a slot waits for release: the engine is not idle yet
        [outcome] = executors.take_outcomes()  # the outcome lands after that look
        assert outcome.task is task
        assert not ActivitySlot.objects.filter(released_at__isnull=True).exists()
        assert not executors.busy
    finally:
        executors.shutdown(5)
