"""SQLite: an engine driving more workflows at once than SQLite binds parameters in one statement (its
limit, lowered to 999 for speed: tests/param_limit.py; 32,766 by default) must not pass it: lists of the
workflows of a pass, a commit or a claim batch go in chunks (``store.backend.Backend.chunks``).

Each statement below failed with "too many SQL variables" on every pass ("database error in tick"),
so the workflows never moved: the mailbox read of parked workflows (an engine holding many workflows
waiting for signals, whatever CLAIM_BATCH_SIZE), the admitted-update read and the commit of a large
claim batch, and the firing of more due delayed starts than the limit."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta

import pytest
from django.test import override_settings

import weft_django as weft
from tests.param_limit import OVER, lowered_param_limit
from weft_django.models import Workflow
from weft_django.store.clock import db_now
from weft_django.testing import Clock, run_until_idle, running_engine

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db(transaction=True)]


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)


def statuses() -> dict[str, int]:
    found: dict[str, int] = {}
    for status in Workflow.objects.values_list("status", flat=True):
        found[status] = found.get(status, 0) + 1
    return found


def test_an_engine_holding_more_parked_workflows_than_the_limit_delivers_their_signals():
    ids = [f"parked-{i:05}" for i in range(OVER)]
    weft.start_many([weft.StartRequest("tests.signals", id=wid) for wid in ids])
    with lowered_param_limit(), running_engine("param-limit-parked") as engine:
        wait_until(lambda: len(engine.owned) == OVER)
        for i, wid in enumerate(ids):
            weft.signal(wid, "go", i)
        wait_until(lambda: not Workflow.objects.exclude(status="completed").exists())
    assert statuses() == {"completed": OVER}


@override_settings(WEFT={"CLAIM_BATCH_SIZE": 5000, "POLL_INTERVAL": "100ms"})
def test_a_claim_batch_over_the_limit_runs_every_workflow_to_its_end():
    weft.start_many([weft.StartRequest("tests.sum", args=[i, 1]) for i in range(OVER)])
    with lowered_param_limit(), contextlib.suppress(TimeoutError):  # still busy: reported below
        run_until_idle(timeout=60)
    assert statuses() == {"completed": OVER}


@override_settings(WEFT={"CLAIM_BATCH_SIZE": 5000, "POLL_INTERVAL": "100ms"})
def test_more_due_delayed_starts_than_the_limit_start_in_one_batch():
    start_at = db_now() + timedelta(hours=1)
    weft.start_many([weft.StartRequest("tests.sum", args=[i, 1], start_at=start_at) for i in range(OVER)])
    Clock().advance(2 * 3600)
    with lowered_param_limit(), contextlib.suppress(TimeoutError):  # still busy: reported below
        run_until_idle(timeout=60)
    assert statuses() == {"completed": OVER}
