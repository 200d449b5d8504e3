"""A deploy that changes WEFT["QUEUES"] under runs using it (in-process engine, the real database): a
concurrency lowered below the runs admitted admits nothing until they fall below it, and a queue removed
leaves its admitted runs running to their end and its waiting runs waiting, stalling no other queue.
A pin from a helper's review (it held before): no change was needed."""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.models import Workflow
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)
FAST = {"POLL_INTERVAL": "50ms"}


def _status() -> dict[str, str]:
    return dict(Workflow.objects.values_list("id", "status"))


def _go(*ids: str) -> None:
    for wid in ids:
        weft.get_handle(wid).signal("go")
    run_until_idle(timeout=15)


def test_a_lowered_limit_and_a_removed_queue_stall_nothing_else():
    with override_settings(WEFT={"QUEUES": {"q": {"concurrency": 3}}, **FAST}):
        for i in range(4):
            weft.start("tests.queued_parks", queue="q", id=f"p{i}")
        run_until_idle(timeout=15)
        assert sorted(wid for wid, status in _status().items() if status == "running") == ["p0", "p1", "p2"]
    with override_settings(WEFT={"QUEUES": {"q": {"concurrency": 1}}, **FAST}):
        _go("p0")
        assert _status()["p3"] == "pending"  # two still admitted: over the new limit of 1
        _go("p1")
        assert _status()["p3"] == "pending"  # one admitted: the limit
        _go("p2")
        assert _status()["p3"] == "running"
        weft.start("tests.queued_parks", queue="q", id="p4")
        run_until_idle(timeout=15)
        assert _status()["p4"] == "pending"
    with override_settings(WEFT={"QUEUES": {"other": {}}, **FAST}):  # "q" removed
        with pytest.raises(weft.UnknownQueueError):
            weft.start("tests.queued_parks", queue="q", id="p5")
        weft.start("tests.queued_parks", queue="other", id="o1")
        _go("p3")
        status = _status()
        assert (status["p3"], status["p4"], status["o1"]) == ("completed", "pending", "running")
