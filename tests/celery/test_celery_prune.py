"""CeleryExecutor._prune_sent after an outage: the sends no context waits for any more (their workflows
dropped for a reload whose loads kept failing) all pass their deadline at once, and the first poll after
the outage times them out, fenced, on the engine's loop thread.

Each used to be one ``remote.expire``: its own transaction of about seven statements, so a poll with
PRUNE_BATCH (500) due sends ran some 3,500 statements in 500 transactions before the engine loop went
on. ``remote.expire_many`` times them all out in one transaction whose statements do not grow with their
number; each expiry is still fenced by (run, seq, attempt, epoch) under the claim locked at its epoch.

The executor is driven directly (its ``_sent`` filled as ``_send`` fills it), on the real database and
the test Celery app; nothing is sent to the broker.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections
from django.db.models import F
from django.test.utils import CaptureQueriesContext

pytest.importorskip("celery")

import weft_django as weft
from tests.celery.test_celery_fencing import running_attempt
from tests.param_limit import lowered_param_limit
from weft_django.engine import remote
from weft_django.engine.celery_executor import CeleryExecutor, _Sent
from weft_django.models import RemoteAttempt, RemoteAttemptState, Step, Workflow, WorkflowClaim
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)
USING = "default"


def _executor() -> CeleryExecutor:
    from tests.celery_app import app

    return CeleryExecutor("owner", queue.SimpleQueue(), USING, poll_interval=0.0, app=app)


def _due(executor: CeleryExecutor, keys: list[remote.AttemptKey]) -> None:
    """Sends past their deadline that no context waits for, as ``_send`` records them."""
    remote.record_sent([(key, "a", "") for key in keys], USING)
    past = time.monotonic() - 1.0
    for key in keys:
        executor._sent[key.ident] = _Sent(past, key, "a")


def _state(key: remote.AttemptKey) -> str:
    return RemoteAttempt.objects.get(run_id=key.run_id, seq=key.seq, attempt=key.attempt, epoch=key.epoch).state


def test_a_poll_after_an_outage_times_out_its_sends_in_statements_that_do_not_grow_with_them() -> None:
    executor = _executor()
    few = [running_attempt() for _ in range(2)]
    many = [running_attempt() for _ in range(30)]
    _due(executor, few)
    with CaptureQueriesContext(connection) as first:
        executor._prune_sent(time.monotonic())
    assert [_state(key) for key in few] == [RemoteAttemptState.EXPIRED] * 2
    _due(executor, many)
    with CaptureQueriesContext(connection) as second:
        executor._prune_sent(time.monotonic())
    assert {_state(key) for key in many} == {RemoteAttemptState.EXPIRED}
    assert all(executor._sent[key.ident].settled for key in few + many)  # kept SENT_KEPT_FOR, fate in the database
    assert len(second) <= len(first) + 1, (
        f"{len(second)} statements to time out 30 sends ({len(first)} for 2): one fenced expiry per send"
    )


def test_one_batch_keeps_each_expiry_fenced() -> None:
    """In one call: a send timed out; one whose worker's result is in (settled, not expired); one whose
    worker's error is in (settled); one of a workflow another engine took over after the executor read
    the claims (not held, nothing written); two attempts of one workflow's step at the same epoch."""
    executor = _executor()
    timed_out = running_attempt()
    done = running_attempt()
    failed = running_attempt()
    taken = running_attempt()
    twice = running_attempt(attempt=2)
    before = twice._replace(attempt=1)
    _due(executor, [timed_out, done, failed, taken, twice, before])
    assert remote.complete(done, '"done"', USING) is remote.Disposition.RECORDED
    error = {"type": "ConnectionError", "message": "x"}
    assert remote.fail(failed, "a", error, ["ConnectionError"], "w", USING) is remote.Disposition.RECORDED
    outcomes = remote.expire_many("owner", [(k, "a") for k in (timed_out, done, failed, twice, before)], USING)
    assert outcomes[timed_out.ident] == (remote.Expiry.EXPIRED, None)
    assert outcomes[twice.ident] == outcomes[before.ident] == (remote.Expiry.EXPIRED, None)
    assert outcomes[done.ident] == (remote.Expiry.SETTLED, remote.RemoteOutcome(ok=True, result='"done"'))
    assert outcomes[failed.ident][0] is remote.Expiry.SETTLED
    assert outcomes[failed.ident][1] == remote.RemoteOutcome(ok=False, error=error, error_types=("ConnectionError",))
    assert _state(timed_out) == RemoteAttemptState.EXPIRED and _state(failed) == RemoteAttemptState.FAILED
    assert remote.complete(timed_out, '"late"', USING) is remote.Disposition.NOT_WAITING
    WorkflowClaim.objects.filter(pk=taken.workflow_id).update(engine_id="other", epoch=taken.epoch + 1)
    assert remote.expire_many("owner", [(taken, "a")], USING) == {taken.ident: (remote.Expiry.NOT_HELD, None)}
    assert _state(taken) == RemoteAttemptState.SENT  # its new owner's business


@contextmanager
def _claim_locked_elsewhere(workflow_id: str) -> Iterator[None]:
    """Another transaction (its own connection, on a thread) holds the claim row until the block ends."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                list(WorkflowClaim.objects.select_for_update().filter(pk=workflow_id))
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(30)
    try:
        yield
    finally:
        release.set()
        thread.join(30)


@pytest.mark.postgres
def test_a_send_whose_claim_row_another_transaction_holds_waits_for_a_later_poll() -> None:
    executor = _executor()
    busy, free = running_attempt(), running_attempt()
    _due(executor, [busy, free])
    with _claim_locked_elsewhere(busy.workflow_id):
        executor._prune_sent(time.monotonic())  # never waits for the row: skips it
        assert not executor._sent[busy.ident].settled and _state(busy) == RemoteAttemptState.SENT
        assert executor._sent[free.ident].settled and _state(free) == RemoteAttemptState.EXPIRED
    executor._prune_sent(time.monotonic())
    assert executor._sent[busy.ident].settled and _state(busy) == RemoteAttemptState.EXPIRED


def _many_attempts(count: int) -> list[remote.AttemptKey]:
    """``count`` workflows whose step 0 waits for attempt 1, held by engine "owner" (running_attempt's,
    written in bulk)."""
    ids = [f"prune-{i:05}" for i in range(count)]
    weft.start_many([weft.StartRequest("tests.celery_echo", args=["k"], id=wid) for wid in ids])
    WorkflowClaim.objects.filter(pk__in=ids).update(epoch=F("epoch") + 1, engine_id="owner")
    epochs = dict(WorkflowClaim.objects.filter(pk__in=ids).values_list("pk", "epoch"))
    runs = {wid: str(run) for wid, run in Workflow.objects.filter(pk__in=ids).values_list("pk", "run_id")}
    now = db_now()
    Step.objects.bulk_create(
        Step(
            workflow_id=wid,
            run_id=runs[wid],
            seq=0,
            kind="activity",
            name="a",
            status="running",
            attempts=1,
            epoch=epochs[wid],
            started_at=now,
        )
        for wid in ids
    )
    return [remote.AttemptKey(wid, runs[wid], 0, 1, epochs[wid]) for wid in ids]


@pytest.mark.sqlite
def test_a_prune_batch_over_sqlites_parameter_limit_times_every_send_out() -> None:
    """PRUNE_BATCH sends bind four parameters each in the expiry's row statements: they go in chunks
    (``Backend.chunks``), not one statement over the limit ("too many SQL variables")."""
    executor = _executor()
    keys = _many_attempts(300)  # 1,200 parameters for their (run, seq, attempt, epoch) against a limit of 999
    _due(executor, keys)
    with lowered_param_limit():
        executor._prune_sent(time.monotonic())
    assert {_state(key) for key in keys} == {RemoteAttemptState.EXPIRED}
