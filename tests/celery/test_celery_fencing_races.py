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

from tests.races import errors, race
from weft_django.engine import remote
from weft_django.models import RemoteAttempt

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
