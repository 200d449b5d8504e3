"""How one occurrence becomes a run under the overlap policy, and the runs a schedule has active.

Whoever fires an occurrence holds the schedule row lock (engines take it with SKIP LOCKED), starts
the run and advances ``next_nominal_at`` / ``next_fire_at`` in one transaction, so an occurrence
starts at most one run. Lock order: schedule row, then claim -> workflow (as everywhere).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .. import events, transitions
from ..models import Schedule, Timer, Workflow
from ..queueing import queue_options
from ..registry import WorkflowDefinition, registry
from ..status import ACTIVE_STATUSES, OverlapPolicy, TimerKind, WorkflowStatus
from ..store import notify, queues, runs
from ..store.commit import fenced
from .fields import stored_input
from .timing import EXISTS, QUEUED, SKIPPED, STARTED


def active_runs(schedule_id: str, using: str) -> list[dict[str, Any]]:
    """The schedule's runs that are still active (running, pending or suspended: a suspended run still
    occupies the slot; so does one pending in its workflow's queue), oldest first, each with
    ``waiting``: queued by overlap="queue", not released (no delayed-start timer, not in a queue)."""
    runs: list[dict[str, Any]] = [
        dict(run)
        for run in Workflow.objects.using(using)
        .filter(schedule_id=schedule_id, status__in=list(ACTIVE_STATUSES))
        .order_by("created_at", "pk")
        .values("id", "run_id", "status", "start_at", "queue", "workflow_type")
    ]
    pending = [
        run["id"]
        for run in runs
        if run["status"] == WorkflowStatus.PENDING and run["start_at"] is None and run["queue"] is None
    ]
    released = set(
        Timer.objects.using(using)
        .filter(workflow_id__in=pending, kind=TimerKind.DELAYED_START)
        .values_list("workflow_id", flat=True)
    )
    for run in runs:
        run["waiting"] = run["id"] in pending and run["id"] not in released
    return runs


def release_waiting(runs: list[dict[str, Any]], now: datetime, using: str) -> str | None:
    """When no run occupies the slot, release the oldest queued run: a delayed-start timer due now,
    which any engine's delayed-start pass turns into a running run with its claim; a queued workflow's
    run (``@weft.workflow(queue=)``) enters its queue instead, where an engine admits it. Returns its id."""
    if any(not run["waiting"] for run in runs):
        return None
    waiting = [run for run in runs if run["waiting"]]
    if not waiting:
        return None
    run = waiting[0]
    definition = registry.latest.get(run["workflow_type"])
    if definition is None:  # an engine of another deploy cannot tell whether it waits in a queue: leave it
        return None
    queue, priority, key = _queue_of(definition)
    if queue is not None:
        if not queues.enter_queue(run["id"], queue, priority, key, using):
            return None  # its claim is locked elsewhere (a cancel): the next pass tries again
    elif not _release_timer(run, now, using):
        return None
    run["waiting"] = False
    notify.send("w", run["id"], using)
    return str(run["id"])


def _release_timer(run: dict[str, Any], now: datetime, using: str) -> bool:
    """Write the delayed-start timer that releases ``run``, fenced: its claim locked first (SKIP
    LOCKED: a cancel holding it is never waited for), then the run read again, still pending and not
    released, under that lock. False when the claim was locked elsewhere or the run changed."""
    with fenced([run["id"]], using, wait=False) as fence:
        if run["id"] not in fence.held:
            return False
        timers = Timer.objects.using(using).filter(workflow_id=run["id"], kind=TimerKind.DELAYED_START)
        still_waiting = (
            Workflow.objects.using(using)
            .filter(pk=run["id"], run_id=run["run_id"], status=WorkflowStatus.PENDING, queue__isnull=True)
            .exists()
        ) and not timers.exists()
        if still_waiting:
            Timer(workflow_id=run["id"], run_id=run["run_id"], kind=TimerKind.DELAYED_START, fire_at=now).save(
                using=using
            )
        return still_waiting


def _queue_of(definition: WorkflowDefinition) -> tuple[str | None, int, str | None]:
    """The queue a schedule's run of ``definition`` waits in (its ``@weft.workflow(queue=)``), as a start's."""
    return queue_options(definition, None, None, None, delayed=False)


def _insert_run(
    row: Schedule, workflow_id: str, definition: WorkflowDefinition, now: datetime, using: str, *, queued: bool
) -> bool:
    """Insert the run with an unheld claim (``store.runs.create_run``): running, or pending in the
    workflow's queue (``@weft.workflow(queue=)``) until an engine admits it, or, when ``queued``
    (overlap="queue"), pending outside any queue until ``release_waiting`` releases it.
    False if the id exists: that occurrence already has its run (use_existing)."""
    if Workflow.objects.using(using).filter(pk=workflow_id).exists():
        return False
    queue, priority, key = (None, 0, None) if queued else _queue_of(definition)
    new = runs.NewRun(
        workflow_id=workflow_id,
        workflow_type=definition.name,
        version=definition.version,
        input_text=stored_input(row),
        schedule_id=row.id,
        queued=queued,
        queue=queue,
        priority=priority,
        concurrency_key=key,
    )
    run = runs.create_run(new, using, now=now, wake=not queued)
    if run is None:
        return False
    events.workflow_started(run, using)
    return True


def fire(row: Schedule, workflow_id: str, definition: WorkflowDefinition, now: datetime, using: str) -> str:
    """Turn one occurrence into a run under the overlap policy, in the caller's transaction (which
    holds the schedule row). Returns STARTED, QUEUED, SKIPPED, or EXISTS (the run id is taken)."""
    policy = row.overlap
    runs = [] if policy == OverlapPolicy.ALLOW else active_runs(row.id, using)
    if runs and policy == OverlapPolicy.SKIP:
        return SKIPPED
    if runs and policy == OverlapPolicy.QUEUE:
        if any(run["waiting"] for run in runs):
            return SKIPPED  # one occurrence waits already: this one is dropped
        return QUEUED if _insert_run(row, workflow_id, definition, now, using, queued=True) else EXISTS
    if runs and policy == OverlapPolicy.CANCEL_RUNNING:
        reason = f'schedule "{row.id}" started {workflow_id} (overlap="cancel_running")'
        transitions.cancel_active([run["id"] for run in runs], reason, using=using)
    return STARTED if _insert_run(row, workflow_id, definition, now, using, queued=False) else EXISTS


def cancel_waiting(schedule_id: str, reason: str, using: str) -> None:
    """Cancel the schedule's queued runs that have not been released (its deletion)."""
    waiting = [run["id"] for run in active_runs(schedule_id, using) if run["waiting"]]
    transitions.cancel_active(waiting, reason, using=using)
