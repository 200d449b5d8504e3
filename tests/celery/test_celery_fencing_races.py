"""Remote (Celery) outcomes racing each other and the owner's timeout (PostgreSQL: threads on their
own connections, released together by a barrier). No broker, no worker: engine/remote.py's rules
driven directly, as tests/celery/test_celery_fencing.py does one at a time.

A redelivered task (acks_late) or a worker lost and retried can report a success and a failure of one
attempt at once, while the owning engine times the attempt out. Exactly one of them may count, and
the owner's poll must read that one; the others are refused with a disposition, never an error.
"""

from __future__ import annotations

import collections

import pytest

import weft_django as weft
from tests.races import alternate, errors, race
from tests.testapp import workflows as testflows
from tests.testapp.models import Reservation
from weft_django.codec import encode_payload
from weft_django.engine import remote
from weft_django.models import RemoteAttempt, Workflow

from .test_celery_fencing import USING, running_attempt, step

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROUNDS = 12
D = remote.Disposition


def test_a_result_a_failure_and_the_timeout_of_one_attempt_racing_count_once():
    seen: collections.Counter[str] = collections.Counter()
    for _ in range(ROUNDS):
        key = running_attempt()
        remote.record_sent([(key, "a", "")], USING)
        error = {"type": "ConnectionError", "message": "down"}
        completed, failed, expired = race(
            lambda key=key: remote.complete(key, '"done"', USING),
            lambda key=key, error=error: remote.fail(key, "a", error, ["ConnectionError"], "w", USING),
            lambda key=key: remote.expire("owner", key, "a", USING),
        )
        assert errors([completed, failed, expired]) == [], (completed, failed, expired)
        counted = [
            name
            for name, won in (
                ("result", completed is D.RECORDED),
                ("failure", failed is D.RECORDED),
                ("timeout", expired[0] is remote.Expiry.EXPIRED),
            )
            if won
        ]
        assert len(counted) == 1, (completed, failed, expired)
        seen[counted[0]] += 1
        outcome = remote.poll([key], USING)[key]
        row = step(key)
        if counted == ["result"]:
            assert (outcome.ok, outcome.result, row.status) == (True, '"done"', "completed")
            assert not RemoteAttempt.objects.filter(run_id=key.run_id, seq=key.seq).exists()
        else:
            assert row.status == "running"  # the owner turns it into a retry or an ActivityError
            assert (outcome.ok, outcome.expired) == (False, counted == ["timeout"]), outcome
    print("result / failure / timeout:", dict(seen))


def test_two_deliveries_of_one_attempt_record_one_result():
    for _ in range(ROUNDS):
        key = running_attempt()
        first, second = race(
            lambda key=key: remote.complete(key, '"first"', USING),
            lambda key=key: remote.complete(key, '"second"', USING),
        )
        assert sorted([first, second], key=str) == sorted([D.RECORDED, D.ALREADY_RECORDED], key=str), (first, second)
        assert step(key).result == ('"first"' if first is D.RECORDED else '"second"')


def test_an_atomic_attempt_racing_a_cancel_commits_its_writes_with_its_result_or_not_at_all():
    """An atomic activity commits its own writes and its step in one transaction, the claim locked
    last; a cancel locks the claim first. Either the attempt is recorded before the cancel (its
    reservation stays), or it is refused or skipped and its writes roll back: never a reservation
    without its result, or a result under the cancel's epoch."""
    seen: collections.Counter[str] = collections.Counter()
    for round_ in range(ROUNDS):
        key = running_attempt("tests.celery_echo", ["k"], activity=testflows.celery_reserve.name)
        order = 500 + round_
        args = encode_payload({"args": [order], "kwargs": {}})
        ran, cancelled = race(
            lambda key=key, args=args: remote.run_attempt(key, testflows.celery_reserve.name, args),
            lambda key=key: weft.cancel(key.workflow_id, reason="race"),
            delays=alternate(round_, 0.02),
        )
        assert cancelled is None, cancelled
        assert Workflow.objects.get(pk=key.workflow_id).status == "cancelled"
        reserved = Reservation.objects.filter(order_id=order).exists()
        if ran is D.RECORDED:
            assert reserved and step(key).status == "completed" and step(key).epoch == key.epoch
        else:
            assert ran in (D.STALE_EPOCH, "skipped"), ran
            assert not reserved and step(key).status == "running"
        seen[str(ran)] += 1
    print("atomic attempt vs cancel:", dict(seen))
