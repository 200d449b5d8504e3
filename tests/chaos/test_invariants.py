"""The invariant checker finds what it claims to find: one clean history passes, and each seeded
violation is reported by its invariant (a checker that never fires would prove nothing)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.chaos.invariants import AckedSignal, AckedUpdate, Expectations, check
from weft_django.codec import encode
from weft_django.models import (
    AppliedUpdate,
    BufferedSignal,
    PendingUpdate,
    Step,
    Timer,
    Workflow,
    WorkflowClaim,
)

pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.chaos]


def workflow(wid: str, status: str = "completed", result: object = "ok", epoch: int = 0, holder: str | None = None):
    now = timezone.now()
    row = Workflow.objects.create(
        id=wid,
        workflow_type="tests.chaos_mixed",
        status=status,
        input=encode({"args": [], "kwargs": {}}),
        result=encode(result) if status == "completed" else None,
        created_at=now,
        updated_at=now,
    )
    WorkflowClaim.objects.create(
        workflow_id=wid, epoch=epoch, engine_id=holder, expires_at=now - timedelta(minutes=1) if holder else None
    )
    return row


def step(row: Workflow, seq: int, epoch: int, kind: str = "activity", minutes_ago: int = 0) -> Step:
    at = timezone.now() - timedelta(minutes=minutes_ago)
    return Step.objects.create(
        workflow=row,
        run_id=row.run_id,
        seq=seq,
        kind=kind,
        status="completed",
        epoch=epoch,
        started_at=at,
        completed_at=at,
        result=encode(None),
    )


def clean_history() -> Expectations:
    good = workflow("good", epoch=11)
    step(good, 0, 10, minutes_ago=2)
    step(good, 1, 11, kind="signal", minutes_ago=1)
    BufferedSignal.objects.create(
        workflow=good,
        run_id=good.run_id,
        name="go",
        signal_id="good:go",
        payload=encode("good"),
        state="consumed",
        consumed_seq=1,
        created_at=timezone.now(),
    )
    update = PendingUpdate.objects.create(
        workflow=good,
        run_id=good.run_id,
        name="add",
        payload=encode(1),
        idempotency_key="good:add1",
        status="completed",
        result=encode(1),
        created_at=timezone.now(),
    )
    AppliedUpdate.objects.create(
        workflow=good,
        run_id=good.run_id,
        seq=1,
        n=0,
        name="add",
        payload=encode(1),
        result=encode(1),
        update_id=update.id,
    )
    return Expectations(
        results={"good": "ok"},
        signals=[AckedSignal("good", "go", "good:go")],
        updates=[AckedUpdate("good", "add", "good:add1", "completed", [1, 1])],
    )


def test_a_clean_history_keeps_every_invariant():
    assert check(clean_history()) == {name: [] for name in check(Expectations(results={}))}


def test_each_seeded_violation_is_reported_by_its_invariant():
    exp = clean_history()
    # I1 / I7: a run left running, a result that differs, a finished run with a gap in its log.
    workflow("stuck", status="running", epoch=20, holder="engine-dead")
    workflow("wrong", result="not ok", epoch=21)
    gap = workflow("gap", epoch=22)
    step(gap, 0, 22)
    step(gap, 2, 22)
    exp.results |= {"stuck": "ok", "wrong": "ok"}
    # I2/I3: a later step committed under an older epoch, and a claim behind its steps.
    zombie = workflow("zombie", epoch=5)
    step(zombie, 0, 30, minutes_ago=2)
    step(zombie, 1, 29, minutes_ago=1)
    # I4: one epoch on two claims.
    workflow("twin-a", epoch=40)
    workflow("twin-b", epoch=40)
    # I5: an acknowledged signal that was never stored.
    exp.signals.append(AckedSignal("good", "go", "lost-signal"))
    # I6: told "completed" but stored rejected; answered differently on retry.
    good = Workflow.objects.get(id="good")
    PendingUpdate.objects.create(
        workflow=good,
        run_id=good.run_id,
        name="add",
        payload=encode(2),
        idempotency_key="good:add2",
        status="rejected",
        created_at=timezone.now(),
    )
    exp.updates.append(AckedUpdate("good", "add", "good:add2", "completed", [3, 4]))
    # A timer outliving its run, and a finished run whose claim is still held.
    Timer.objects.create(workflow=good, run_id=good.run_id, kind="sleep", seq=3, fire_at=timezone.now())
    workflow("held", epoch=50, holder="engine-live")
    exp.dead_engines = {"engine-dead"}

    found = check(exp)
    expected_hits = {
        "I1 one step per (run, seq)": "gap",
        "I2/I3 no write from an older epoch": "zombie",
        "I4 epochs never reused": "epoch 40",
        "I5 signals accounted for": "lost-signal",
        "I6 updates accounted for": "good:add2",
        "I7 every run terminal": "stuck",
        "I7 results as expected": "wrong",
        "timers not orphaned": "sleep good",
        "no claim held by a dead engine": "stuck",
    }
    for name, needle in expected_hits.items():
        assert any(needle in violation for violation in found[name]), (name, found[name])
    assert any("held" in violation for violation in found["no claim held by a dead engine"])
    assert any("answered differently" in violation for violation in found["I6 updates accounted for"])
    assert any("claim epoch 5" in violation for violation in found["I2/I3 no write from an older epoch"])
