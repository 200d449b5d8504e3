"""One engine subprocess, on either database (the SQLite run's queue test): concurrency 2 holds, by the
activities' own records, and every run completes in FIFO admission order."""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from tests.queues.test_queue_engines import _intervals, _most_admitted_at_once, _most_at_once
from weft_django.models import Workflow
from weft_django.testing import wait_for

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

WEFT = {"QUEUES": {"cap": {"concurrency": 2, "per_engine": 2}}, "POLL_INTERVAL": "100ms"}


@override_settings(WEFT=WEFT)
def test_one_engine_runs_two_at_a_time_in_order(weft_engines):
    weft_engines("single", "--concurrency", "8", weft=WEFT)
    ids = [weft.start("tests.queued", kwargs={"seconds": 0.2}, queue="cap", id=f"one-{i:02d}").id for i in range(10)]
    wait_for(
        lambda: Workflow.objects.filter(id__in=ids, status="completed").count() == len(ids),
        timeout=50,
        message="every queued run completed",
    )
    assert _most_at_once(_intervals({})) == 2
    assert _most_admitted_at_once("cap") == 2
    order = list(Workflow.objects.filter(id__in=ids).order_by("admitted_at", "id").values_list("id", flat=True))
    assert order == ids
