"""A Celery attempt's timeout against its RemoteAttempt row held by a user's open transaction
(PostgreSQL row locks). The executor times out, on the engine's loop, the attempts past their deadline
(``remote.expire_many``): the claims are locked skipping held rows, but the attempt rows were then marked
expired with a plain UPDATE, which waited for a held one (the engine session's lock_timeout, half the
claim TTL; here, with no bound, until the holder let go), and the engine's loop with it. Now such an
attempt is left for a later poll, as one whose claim row is held (tests/celery/test_celery_prune.py).

The executor is driven directly on the real database and the test Celery app; nothing is sent."""

from __future__ import annotations

import time

import pytest
from django.db import connection

pytest.importorskip("celery")

from tests.celery.test_celery_fencing import running_attempt
from tests.celery.test_celery_prune import _due, _executor, _state
from tests.engine.locked import row_lock
from tests.engine.test_commit_locks import holding
from weft_django.engine import remote
from weft_django.models import RemoteAttempt, RemoteAttemptState

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
USING = "default"


def _row(key: remote.AttemptKey) -> int:
    return int(RemoteAttempt.objects.get(run_id=key.run_id, seq=key.seq, attempt=key.attempt, epoch=key.epoch).pk)


@pytest.mark.parametrize("lock", ["for-update", "for-share"])
def test_a_send_whose_attempt_row_a_user_holds_is_timed_out_by_a_later_poll(lock) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    executor = _executor()
    busy, free = running_attempt(), running_attempt()
    _due(executor, [busy, free])
    with holding(*row_lock("remoteattempt", "id", _row(busy), lock), hold_at_most=20) as released:
        executor._prune_sent(time.monotonic())  # never waits for the row: leaves it to a later poll
        assert not released.is_set(), "the expiry waited for the attempt row the user held"
        assert not executor._sent[busy.ident].settled and _state(busy) == RemoteAttemptState.SENT
        assert executor._sent[free.ident].settled and _state(free) == RemoteAttemptState.EXPIRED
    executor._prune_sent(time.monotonic())
    assert executor._sent[busy.ident].settled and _state(busy) == RemoteAttemptState.EXPIRED
    assert remote.complete(busy, '"late"', USING) is remote.Disposition.NOT_WAITING  # fenced out


def test_expire_reports_a_held_attempt_row_busy() -> None:
    """The owner's own timeout path (``remote.expire``, for an attempt its context waits for) too."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    key = running_attempt()
    remote.record_sent([(key, "a", "")], USING)
    with holding(*row_lock("remoteattempt", "id", _row(key)), hold_at_most=20) as released:
        assert remote.expire("owner", key, "a", USING) == (remote.Expiry.BUSY, None)
        assert not released.is_set() and _state(key) == RemoteAttemptState.SENT
    assert remote.expire("owner", key, "a", USING) == (remote.Expiry.EXPIRED, None)
