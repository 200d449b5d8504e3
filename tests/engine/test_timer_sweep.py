"""The orphaned-timer sweep: timers of missing or terminal runs are collected, a bounded window per
pass (so a pass costs the same however many timers sleep), and a cycle covers every timer."""

from __future__ import annotations

import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest

from weft_django.engine import sweeps
from weft_django.engine.periodic import builtin_tasks
from weft_django.models import Timer, Workflow
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)


def make_run(workflow_id: str, status: str, timers: int = 1) -> None:
    now = db_now()
    run_id = uuid.uuid4()
    Workflow.objects.create(
        id=workflow_id,
        run_id=run_id,
        workflow_type="tests.sum",
        status=status,
        input='{"args":[1,2],"kwargs":{}}',
        created_at=now,
        updated_at=now,
    )
    Timer.objects.bulk_create(
        Timer(workflow_id=workflow_id, run_id=run_id, kind="sleep", seq=i, fire_at=now + timedelta(days=1))
        for i in range(timers)
    )


def orphan(workflow_id: str) -> None:
    """A timer whose workflow row is gone."""
    Timer.objects.create(workflow_id=workflow_id, kind="sleep", seq=0, fire_at=db_now())


ENGINE = SimpleNamespace(using="default", engine_id="test-sweep")


def test_a_cycle_collects_timers_of_missing_and_terminal_runs_only():
    make_run("running", "running", timers=2)
    make_run("suspended", "suspended")  # keeps its timers: re-armed after resume
    make_run("pending", "pending")
    make_run("done", "completed", timers=2)
    make_run("failed", "failed")
    orphan("gone")
    assert sweeps.collect_orphaned_timers(ENGINE, db_now()) is True  # type: ignore[arg-type]
    assert sorted(Timer.objects.values_list("workflow_id", flat=True)) == ["pending", "running", "running", "suspended"]
    assert sweeps.collect_orphaned_timers(ENGINE, db_now()) is False  # type: ignore[arg-type]


def test_a_pass_examines_one_window_and_the_cycle_resumes_where_it_stopped(monkeypatch):
    monkeypatch.setattr(sweeps, "SWEEP_BATCH", 3)
    for i in range(4):
        make_run(f"live-{i}", "running")
    for i in range(3):
        orphan(f"gone-{i}")  # the last three timers by primary key
    sweep = sweeps.OrphanedTimerSweep()
    assert sweep.interval(ENGINE) == sweeps.INTERVAL  # type: ignore[arg-type]
    assert sweep.run(ENGINE, db_now()) is False  # type: ignore[arg-type]  # timers 1-3: all live
    assert sweep.after and sweep.interval(ENGINE) == sweeps.CYCLE_PASS_INTERVAL  # type: ignore[arg-type]
    assert Timer.objects.count() == 7
    assert sweep.run(ENGINE, db_now()) is True  # type: ignore[arg-type]  # timers 4-6
    assert sorted(Timer.objects.values_list("workflow_id", flat=True)) == ["gone-2"] + [f"live-{i}" for i in range(4)]
    assert sweep.run(ENGINE, db_now()) is True  # type: ignore[arg-type]  # timer 7: a short window ends the cycle
    assert sweep.after == 0
    assert Timer.objects.count() == 4


def test_schedule_timers_are_not_swept():
    Timer.objects.create(workflow_id="a-schedule", kind="schedule", fire_at=db_now())
    assert sweeps.collect_orphaned_timers(ENGINE, db_now()) is False  # type: ignore[arg-type]
    assert Timer.objects.count() == 1


def test_the_engine_runs_the_sweep_as_a_periodic_chore():
    task = next(t for t in builtin_tasks() if t.name == "timer-sweep")
    orphan("gone")
    assert task.run(ENGINE, db_now()) is True  # type: ignore[arg-type]
    assert not Timer.objects.exists()
