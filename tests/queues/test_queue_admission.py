"""Queues in one process (PostgreSQL and SQLite): bad input writes nothing, settings checks, FIFO and
priority order, per-key serialisation, a parked run keeps its slot, idempotency keys deduplicate."""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django import conf
from weft_django.models import Workflow
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = {
    "one": {"concurrency": 1},
    "prio": {"concurrency": 1, "priorities": True},
    "keyed": {"concurrency": 10},
    "tests-default": {},
}
WEFT = {"QUEUES": QUEUES, "POLL_INTERVAL": "50ms"}


def _order(ids: list[str]) -> list[str]:
    rows = Workflow.objects.filter(id__in=ids).order_by("admitted_at", "id").values_list("id", flat=True)
    return list(rows)


@override_settings(WEFT=WEFT)
def test_bad_queue_arguments_are_typed_errors_and_write_nothing():
    cases = [
        ({"queue": "nope"}, weft.UnknownQueueError),
        ({"queue": ""}, weft.InvalidArgumentError),
        ({"queue": "one", "priority": 3}, weft.InvalidArgumentError),  # no priorities in "one"
        ({"queue": "prio", "priority": -1}, weft.InvalidArgumentError),
        ({"queue": "prio", "priority": True}, weft.InvalidArgumentError),
        ({"queue": "prio", "priority": 2**31}, weft.InvalidArgumentError),
        ({"priority": 1}, weft.InvalidArgumentError),  # no queue
        ({"concurrency_key": "k"}, weft.InvalidArgumentError),
        ({"queue": "keyed", "concurrency_key": ""}, weft.InvalidArgumentError),
        ({"queue": "keyed", "concurrency_key": "x" * 256}, weft.InvalidArgumentError),
        ({"queue": "one", "start_after": "5s"}, weft.InvalidArgumentError),
    ]
    for options, error in cases:
        with pytest.raises(error):
            weft.start("tests.queued", id="bad", **options)
    assert not Workflow.objects.exists()


@pytest.mark.parametrize(
    ("queues", "check_id"),
    [
        ([1, 2], "weft.E029"),
        ({"q": 3}, "weft.E029"),
        ({"": {}}, "weft.E029"),
        # A name no text column holds: a NUL failed that queue's admission on every pass (PostgreSQL
        # refuses it), a lone surrogate (UTF-8 cannot encode it, no DatabaseError) every engine pass.
        ({"q\x00": {}}, "weft.E029"),
        ({"q\ud800": {}}, "weft.E029"),
        ({"q": {"concurrency": 0}}, "weft.E030"),
        ({"q": {"concurrency": -2}}, "weft.E030"),
        ({"q": {"per_engine": 1.5}}, "weft.E030"),
        ({"q": {"rate": "ten a second"}}, "weft.E031"),
        ({"q": {"rate": "0/s"}}, "weft.E031"),
        ({"q": {"rate": "5/0s"}}, "weft.E031"),
        ({"q": {"priorities": "yes"}}, "weft.E032"),
        ({"q": {"concurency": 2}}, "weft.E032"),
    ],
)
def test_broken_queue_settings_have_check_ids(queues, check_id):
    with override_settings(WEFT={"QUEUES": queues}):
        assert check_id in [problem.id for problem in conf.problems()]
        with pytest.raises(weft.ConfigurationError):
            weft.start("tests.queued", queue="q")
    assert not Workflow.objects.exists()


def test_rates_parse():
    from weft_django.flow import parse_rate

    assert (parse_rate("100/m").limit, parse_rate("100/m").period.total_seconds()) == (100, 60)
    assert parse_rate("5/30s").period.total_seconds() == 30
    assert parse_rate("10 / h").period.total_seconds() == 3600
    assert parse_rate((3, 0.5)).limit == 3


@override_settings(WEFT=WEFT)
def test_a_queued_run_waits_pending_until_admitted_then_runs():
    handle = weft.start("tests.queued", queue="one")
    row = Workflow.objects.get(pk=handle.id)
    assert (row.status, row.queue, row.admitted_at, row.started_at) == ("pending", "one", None, None)
    run_until_idle()
    row.refresh_from_db()
    assert row.status == "completed" and row.admitted_at is not None
    assert handle.result(timeout=5) > 0


@override_settings(WEFT=WEFT)
def test_the_workflow_decorator_names_its_queue():
    handle = weft.start("tests.queued_default")
    assert Workflow.objects.get(pk=handle.id).queue == "tests-default"
    run_until_idle()
    assert Workflow.objects.get(pk=handle.id).status == "completed"


@override_settings(WEFT=WEFT)
def test_fifo_and_priority_order():
    fifo = [weft.start("tests.queued", queue="one", id=f"fifo-{i}").id for i in range(4)]
    prio = [weft.start("tests.queued", queue="prio", id=f"p{i}", priority=p).id for i, p in enumerate([5, 1, 5, 0, 1])]
    run_until_idle()
    assert _order(fifo) == fifo
    assert _order(prio) == ["p3", "p1", "p4", "p0", "p2"]  # lower first, FIFO within a priority


@override_settings(WEFT=WEFT)
def test_one_run_per_concurrency_key_at_a_time():
    ids = [weft.start("tests.queued_parks", queue="keyed", concurrency_key="cust-a", id=f"a{i}").id for i in range(2)]
    other = weft.start("tests.queued_parks", queue="keyed", concurrency_key="cust-b", id="b0").id
    run_until_idle()
    status = dict(Workflow.objects.values_list("id", "status"))
    assert status == {"a0": "running", "a1": "pending", "b0": "running"}  # a0 parked: it keeps its key
    weft.signal("a0", "go")
    run_until_idle()
    status = dict(Workflow.objects.values_list("id", "status"))
    assert status["a0"] == "completed" and status["a1"] == "running"
    assert ids and other


@override_settings(WEFT=WEFT)
def test_a_parked_run_keeps_its_slot_and_a_cancelled_waiting_run_leaves_the_queue():
    first = weft.start("tests.queued_parks", queue="one", id="park-1")
    second = weft.start("tests.queued", queue="one", id="park-2")
    third = weft.start("tests.queued", queue="one", id="park-3")
    run_until_idle()
    assert Workflow.objects.get(pk="park-2").status == "pending"
    third.cancel()
    first.signal("go")
    run_until_idle()
    assert first.result(timeout=5) == "went" and second.result(timeout=5) > 0
    assert Workflow.objects.get(pk="park-3").status == "cancelled"
    assert Workflow.objects.get(pk="park-3").admitted_at is None


@override_settings(WEFT=WEFT)
def test_an_idempotency_key_deduplicates_a_queued_start():
    first = weft.start("tests.queued", queue="one", idempotency_key="order-7")
    again = weft.start("tests.queued", queue="one", idempotency_key="order-7")
    assert first.id == again.id and Workflow.objects.count() == 1
    run_until_idle()
    assert weft.start("tests.queued", queue="one", idempotency_key="order-7").id == first.id


@override_settings(WEFT=WEFT)
def test_start_many_queues_its_runs_like_start():
    """start_many's requests wait in their queue (or the workflow's) and are admitted in order; before
    the StartRequest had queue fields, a start_many of a queued workflow ran unqueued."""
    requests = [
        weft.StartRequest("tests.queued", queue="prio", id=f"m{i}", priority=p) for i, p in enumerate([3, 0, 3])
    ]
    requests.append(weft.StartRequest("tests.queued_default", id="m-default"))
    handles = weft.start_many(requests)
    rows = dict(Workflow.objects.values_list("id", "status"))
    assert rows == {"m0": "pending", "m1": "pending", "m2": "pending", "m-default": "pending"}
    assert Workflow.objects.get(pk="m-default").queue == "tests-default"
    run_until_idle()
    assert _order(["m0", "m1", "m2"]) == ["m1", "m0", "m2"]
    assert all(handle.result(timeout=5) > 0 for handle in handles)


@override_settings(WEFT=WEFT)
def test_start_many_refuses_a_bad_queue_and_writes_nothing():
    with pytest.raises(weft.UnknownQueueError, match=r"requests\[1\]"):
        weft.start_many(
            [weft.StartRequest("tests.queued", queue="one"), weft.StartRequest("tests.queued", queue="nope")]
        )
    with pytest.raises(weft.InvalidArgumentError, match=r"requests\[0\]"):
        weft.start_many([weft.StartRequest("tests.queued", queue="one", start_after="5s")])
    assert not Workflow.objects.exists()
