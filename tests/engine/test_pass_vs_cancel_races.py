"""An engine's pass starting a pending run racing a client's cancel of it (PostgreSQL: threads on
their own connections, released together by a barrier, each side held back in turn): the
delayed-start pass (``store.claims.start_delayed``) and a queue's admission (``store.queues.admit``).

Both lock the claim first (the pass SKIP LOCKED), the cancel too: the run is started then cancelled
(the cancel's new epoch deposes the pass's holder), or cancelled and never started. Either way it
ends cancelled, held by no engine, with no delayed-start timer left, and the pass never reports a run
it did not start.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import weft_django as weft
from tests.races import alternate, race
from weft_django.flow import QueueConfig
from weft_django.models import Timer, Workflow, WorkflowClaim
from weft_django.store import claims, queues
from weft_django.store.clock import db_now

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROUNDS = 10
TTL = timedelta(seconds=30)


def _ended_cancelled_and_unheld(workflow_id: str) -> None:
    assert Workflow.objects.get(pk=workflow_id).status == "cancelled"
    assert WorkflowClaim.objects.get(pk=workflow_id).engine_id is None
    assert not Timer.objects.filter(workflow_id=workflow_id).exists()


def test_a_delayed_start_racing_a_cancel_of_its_run(weft_clock):
    seen = set()
    for round_ in range(ROUNDS):
        handle = weft.start("tests.signals", id=f"ds-{round_}", start_after="1m")
        weft_clock.advance(61)
        now = db_now()
        started, cancelled = race(
            lambda now=now: claims.start_delayed("pass-engine", limit=10, ttl=TTL, now=now, using="default"),
            lambda h=handle: weft.cancel(h.id, reason="race"),
            delays=alternate(round_, 0.02),
        )
        assert cancelled is None, cancelled
        assert isinstance(started, dict), started
        assert set(started) <= {handle.id}
        seen.add("started, then cancelled" if started else "cancelled first")
        _ended_cancelled_and_unheld(handle.id)
    print("delayed start vs cancel:", sorted(seen))


@override_settings(WEFT={"QUEUES": {"race": {"concurrency": 5}}})
def test_an_admission_racing_a_cancel_of_the_queued_run():
    queue = QueueConfig("race", concurrency=5)
    seen = set()
    for round_ in range(ROUNDS):
        handle = weft.start("tests.queued", queue="race", id=f"qa-{round_}")
        admitted, cancelled = race(
            lambda: queues.admit("pass-engine", queue, limit=10, ttl=TTL, using="default"),
            lambda h=handle: weft.cancel(h.id, reason="race"),
            delays=alternate(round_, 0.02),
        )
        assert cancelled is None, cancelled
        assert isinstance(admitted, dict) and set(admitted) <= {handle.id}, admitted
        seen.add("admitted, then cancelled" if admitted else "cancelled first")
        _ended_cancelled_and_unheld(handle.id)
    print("admission vs cancel:", sorted(seen))
