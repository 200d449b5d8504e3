"""Retention: terminal runs older than WEFT["RETENTION"][status] are purged, in bounded batches, and a
reused id after a purge never sees an old epoch."""

from __future__ import annotations

import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest

import weft_django as weft
from weft_django.conf import get_settings
from weft_django.engine import retention
from weft_django.engine.schedules import ScheduleFiring
from weft_django.models import IdempotencyKey, Step, Workflow, WorkflowClaim
from weft_django.store.clock import db_now
from weft_django.store.epochs import next_epoch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def short_retention(settings):
    settings.WEFT = {
        **settings.WEFT,
        "RETENTION": {"completed": "1d", "failed": "3d", "cancelled": None, "timed_out": "12h"},
    }


def make_run(workflow_id: str, status: str, finished_ago: timedelta | None, parent_id: str | None = None) -> None:
    """A run row with its claim and one step, as the engine would leave it."""
    now = db_now()
    run_id = uuid.uuid4()
    Workflow.objects.create(
        id=workflow_id,
        run_id=run_id,
        workflow_type="tests.sum",
        status=status,
        input='{"args":[1,2],"kwargs":{}}',
        parent_id=parent_id,
        created_at=now - timedelta(days=500),
        updated_at=now,
        finished_at=None if finished_ago is None else now - finished_ago,
    )
    WorkflowClaim.objects.create(workflow_id=workflow_id, epoch=next_epoch("default"))
    Step.objects.create(
        workflow_id=workflow_id, run_id=run_id, seq=0, kind="activity", status="completed", epoch=1, started_at=now
    )


def remaining() -> set[str]:
    return set(Workflow.objects.values_list("pk", flat=True))


def test_removes_only_what_is_expired_for_its_status(short_retention):
    day = timedelta(days=1)
    rows = {
        "completed-old": ("completed", 2 * day, None),
        "completed-new": ("completed", day / 2, None),
        "failed-2d": ("failed", 2 * day, None),  # failed keeps 3 days
        "failed-4d": ("failed", 4 * day, None),
        "cancelled-400d": ("cancelled", 400 * day, None),  # None: kept for ever
        "timed-out-13h": ("timed_out", day / 2 + timedelta(hours=1), None),
        "running": ("running", None, None),
        "suspended": ("suspended", None, None),
        "pending": ("pending", None, None),
        "child-of-running": ("completed", 2 * day, "running"),  # kept while its parent is active
        "child-of-finished": ("completed", 2 * day, "completed-new"),
    }
    for workflow_id, (status, age, parent) in rows.items():
        make_run(workflow_id, status, age, parent)
    purged, more = retention.purge_expired(get_settings().retention, "default")
    assert (purged, more) == (4, False)
    gone = {"completed-old", "failed-4d", "timed-out-13h", "child-of-finished"}
    assert remaining() == set(rows) - gone
    assert not WorkflowClaim.objects.filter(workflow_id__in=gone).exists()
    assert not Step.objects.filter(workflow_id__in=gone).exists()
    assert retention.purge_expired(get_settings().retention, "default") == (0, False)


def test_purges_in_bounded_batches_oldest_first(short_retention):
    for age in range(2, 9):
        make_run(f"old-{age}", "completed", timedelta(days=age))
    settings = get_settings().retention
    assert retention.purge_expired(settings, "default", batch_size=3) == (3, True)
    assert remaining() == {"old-2", "old-3", "old-4", "old-5"}
    assert retention.purge_expired(settings, "default", batch_size=3) == (3, True)
    assert retention.purge_expired(settings, "default", batch_size=3) == (1, False)
    assert remaining() == set()


def test_sweep_runs_again_soon_while_a_backlog_remains(short_retention, monkeypatch):
    monkeypatch.setattr(retention, "BATCH_SIZE", 2)
    for age in range(2, 7):
        make_run(f"old-{age}", "completed", timedelta(days=age))
    engine = SimpleNamespace(using="default", settings=get_settings(), engine_id="test")
    sweep = retention.RetentionSweep()
    assert sweep.interval(engine) == retention.INTERVAL  # type: ignore[arg-type]
    passes = []
    while not passes or sweep.backlog:
        sweep.run(engine, db_now())  # type: ignore[arg-type]
        passes.append(len(remaining()))
        assert sweep.interval(engine) == (  # type: ignore[arg-type]
            get_settings().poll_interval.total_seconds() if sweep.backlog else retention.INTERVAL
        )
    assert passes == [3, 1, 0]


def test_engine_purges_and_a_reused_id_gets_a_higher_epoch(weft_clock, weft_run_until_idle):
    first = weft.start("tests.sum", args=[1, 2], id="reused")
    weft_run_until_idle()
    assert first.result(timeout=5) == {"total": 3}
    old_epochs = {WorkflowClaim.objects.get(workflow_id="reused").epoch} | set(
        Step.objects.filter(workflow_id="reused").values_list("epoch", flat=True)
    )
    weft_clock.advance(timedelta(days=6).total_seconds())
    weft_run_until_idle()
    assert Workflow.objects.filter(pk="reused").exists()  # completed runs are kept 7 days by default
    weft_clock.advance(timedelta(days=2).total_seconds())
    weft_run_until_idle()
    assert not Workflow.objects.filter(pk="reused").exists()
    assert not WorkflowClaim.objects.filter(workflow_id="reused").exists()
    assert not Step.objects.filter(workflow_id="reused").exists()
    again = weft.start("tests.sum", args=[2, 2], id="reused")
    assert WorkflowClaim.objects.get(workflow_id="reused").epoch > max(old_epochs)
    weft_run_until_idle()
    assert again.result(timeout=5) == {"total": 4}
    assert min(Step.objects.filter(workflow_id="reused").values_list("epoch", flat=True)) > max(old_epochs)


def test_idempotency_key_of_a_purged_run_says_so(weft_clock, weft_run_until_idle):
    weft.start("tests.sum", args=[1, 1], idempotency_key="order-7")
    weft_run_until_idle()
    weft_clock.advance(timedelta(days=8).total_seconds())
    weft_run_until_idle()
    assert IdempotencyKey.objects.get(pk="order-7").purged_at is not None
    with pytest.raises(weft.IdempotencyKeyPurgedError):
        weft.start("tests.sum", args=[1, 1], idempotency_key="order-7")


def test_idle_chore_passes_are_cheap(django_assert_max_num_queries, short_retention):
    """Both chores run on every engine; with nothing to do they cost a few indexed queries."""
    weft.schedule("tests.scheduled_run", id="later", every=3600)
    make_run("recent", "completed", timedelta(hours=1))
    engine = SimpleNamespace(using="default", settings=get_settings(), engine_id="test")
    now = db_now()
    with django_assert_max_num_queries(2):  # due schedules, queued runs
        assert ScheduleFiring().run(engine, now) is False  # type: ignore[arg-type]
    with django_assert_max_num_queries(3):  # one query per status with a retention
        assert retention.RetentionSweep().run(engine, now) is False  # type: ignore[arg-type]
