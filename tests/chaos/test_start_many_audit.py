"""Runs started by ``weft.start_many`` (ids, idempotency keys, delayed starts, a start_new over a finished
run) and run by two real engines, one of them SIGKILLed midway, under the write audit
(tests/chaos/audit.py): every check A1-A6 finds nothing, each run ends once with its result, and each
of its activities completed exactly once per step. Short: about 15 s."""

from __future__ import annotations

import signal
import time

import pytest
from django.db.models import Count

import weft_django as weft
from tests.chaos import audit
from tests.chaos.harness import ChaosEngine, Plan, db_settings
from tests.testapp.models import ActivityCall
from weft_django.models import Step, Workflow, WorkflowClaim

pytestmark = [pytest.mark.chaos, pytest.mark.postgres, pytest.mark.subprocess]

SEQUENTIAL = {"tests.three_steps"}


def _requests(prefix: str, count: int) -> list[weft.StartRequest]:
    requests = []
    for i in range(count):
        key = f"{prefix}-{i}"
        if i % 3 == 0:
            requests.append(weft.StartRequest("tests.three_steps", kwargs={"key": key}, idempotency_key=key))
        elif i % 3 == 1:
            requests.append(weft.StartRequest("tests.three_steps", kwargs={"key": key}, id=key, start_after="200ms"))
        else:
            requests.append(weft.StartRequest("tests.three_steps", kwargs={"key": key}, id=key))
    return requests


@pytest.mark.django_db(transaction=True)
def test_runs_started_by_start_many_keep_every_audited_promise() -> None:
    plan = Plan(name="bulk", workflows=0, engines=2, faults=[])
    audit.install()
    engines: list[ChaosEngine] = []
    try:
        weft.start("tests.three_steps", id="bulk-replaced", kwargs={"key": "bulk-replaced-old"})
        engines = [ChaosEngine(f"bulk-e{i}", plan, db_settings()) for i in (1, 2)]
        first = weft.start_many(_requests("bulk-a", 90))
        deadline = time.monotonic() + 60
        while Workflow.objects.filter(status="completed").count() < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        held = dict(
            WorkflowClaim.objects.filter(engine_id__isnull=False)
            .values("engine_id")
            .annotate(n=Count("pk"))
            .values_list("engine_id", "n")
        )
        victim = max(engines, key=lambda engine: held.get(engine.engine_id, 0))  # one that holds claims
        victim.signal(signal.SIGKILL)  # its claims lapse and are taken over (TTL 2 s)
        engines.append(ChaosEngine("bulk-e3", plan, db_settings()))
        while Workflow.objects.get(pk="bulk-replaced").status != "completed" and time.monotonic() < deadline:
            time.sleep(0.05)
        second = weft.start_many(
            [
                *_requests("bulk-b", 60),
                *_requests("bulk-a", 3),  # again: the key is the same run, the ids are taken (per-request errors)
                weft.StartRequest(
                    "tests.three_steps", kwargs={"key": "bulk-replaced"}, id="bulk-replaced", on_conflict="start_new"
                ),
            ]
        )
        assert all(isinstance(r, weft.WorkflowHandle) for r in first)
        assert second[60].id == first[0].id  # the key's run
        assert isinstance(second[61], weft.WorkflowAlreadyExistsError) and second[62].index == 62
        assert second[63].id == "bulk-replaced"
        while Workflow.objects.exclude(status="completed").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for engine in engines:
            engine.stop()
    try:
        runs = {w.id: w for w in Workflow.objects.all() if w.id.startswith("bulk-") or w.idempotency_key is not None}
        assert len(runs) == 151 and all(w.status == "completed" for w in runs.values()), [
            (w.id, w.status) for w in runs.values() if w.status != "completed"
        ]
        assert all(w.result is not None for w in runs.values())
        assert Step.objects.filter(status="completed").count() == 3 * 151  # the replaced run's steps are gone
        # Every step's activity ran (at least once: an attempt in flight at the kill may run again; each
        # step is recorded once, which A2 checks); the replaced run's three ran before it was replaced.
        assert ActivityCall.objects.filter(name="record_call").values("key").distinct().count() == 3 * 151 + 3
        violations, figures = audit.check_audit([], SEQUENTIAL)
        assert {name: found[:5] for name, found in violations.items() if found} == {}
        assert figures["by_kind"].get("client start", 0) >= 151
        assert any("took over" in e.output() for e in engines if e is not victim), "the kill did not bite"
    finally:
        audit.uninstall()
