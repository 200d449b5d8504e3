"""store.commit.fenced: the one entry point for workflow-scoped transactions other than the engine's
batch commit. It locks the claims first, in workflow_id order, and yields what it locked: by id
whoever holds them, under a stated holder and epochs, at epochs while some engine holds them (a
Celery worker), and with the active descendants a run's end would close."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

import weft_django as weft
from weft_django.engine import ownership
from weft_django.models import WorkflowClaim
from weft_django.store import claims
from weft_django.store.commit import fenced

pytestmark = pytest.mark.django_db(transaction=True)
TTL, RENEW = timedelta(seconds=30), timedelta(seconds=5)


def _epoch(workflow_id: str) -> int:
    return int(WorkflowClaim.objects.get(pk=workflow_id).epoch)


def test_it_locks_by_id_whoever_holds_the_claims_and_opens_a_transaction():
    first, second = weft.start("tests.signals"), weft.start("tests.signals")
    with fenced([second.id, first.id, "no-such-workflow"], "default") as fence:
        assert connection.in_atomic_block
        assert fence.held == {first.id, second.id} and fence.family == set()
    assert not connection.in_atomic_block


def test_a_stated_holder_gets_only_the_claims_it_holds_at_those_epochs():
    handle = weft.start("tests.signals")
    epoch = ownership.acquire("fenced-a", limit=10, ttl=TTL, renew_interval=RENEW, using="default")[handle.id][0]
    with fenced([handle.id], "default", holder=("fenced-a", {handle.id: epoch})) as fence:
        assert fence.held == {handle.id}
    with fenced([handle.id], "default", holder=("fenced-b", {handle.id: epoch})) as fence:
        assert fence.held == set()
    with fenced([handle.id], "default", holder=("fenced-a", {handle.id: epoch - 1})) as fence:
        assert fence.held == set()
    assert claims.classify_unheld("fenced-b", {handle.id: epoch}, "default") == ({handle.id: "deposed"}, set())


def test_any_holder_at_the_epochs_is_what_a_celery_outcome_needs():
    handle = weft.start("tests.signals")
    unheld = _epoch(handle.id)
    with fenced([handle.id], "default", holder=(None, {handle.id: unheld})) as fence:
        assert fence.held == set()  # nobody holds it: no worker's outcome may land
    epoch = ownership.acquire("fenced-a", limit=10, ttl=TTL, renew_interval=RENEW, using="default")[handle.id][0]
    with fenced([handle.id], "default", holder=(None, {handle.id: epoch})) as fence:
        assert fence.held == {handle.id}
    with fenced([handle.id], "default", holder=(None, {handle.id: unheld})) as fence:
        assert fence.held == set()  # an old epoch


def test_family_locks_the_active_descendants_too(weft_run_until_idle):
    weft.start("tests.parent_waits_forever", args=["terminate"], id="fenced-parent")
    weft_run_until_idle()
    with fenced(["fenced-parent"], "default", family=True) as fence:
        assert fence.held == {"fenced-parent"}
        assert fence.family == {"fenced-parent-kid"}
    with fenced(["fenced-parent"], "default", family=True, holder=("nobody", {"fenced-parent": 1})) as fence:
        assert fence.held == set()
        assert fence.family == {"fenced-parent-kid"}
