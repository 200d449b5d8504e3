"""Runs and steps: creating a run (start, children, schedules), writing steps, run status rows."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import DatabaseError, connections
from django.db.models import Q

from ..models import Step, Timer, Workflow, WorkflowClaim
from ..status import StepStatus, TimerKind, WorkflowStatus

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


def claimable(now: datetime, using: str) -> bool:
    """Whether a run waits for an engine: a running workflow whose claim is unheld (and not backing
    off after being stuck), or a delayed start that is due.

    Args:
        now: workflow time (the database clock).
        using: the connection alias.
    """
    # runnable: the partial index weft_claim_free holds exactly these rows (no finished runs).
    unheld = WorkflowClaim.objects.using(using).filter(engine_id__isnull=True, runnable=True).values("workflow_id")
    runnable = Workflow.objects.using(using).filter(
        Q(stuck_retry_at__isnull=True) | Q(stuck_retry_at__lte=now),
        status=WorkflowStatus.RUNNING,
        id__in=unheld,
    )
    due_starts = Timer.objects.using(using).filter(kind=TimerKind.DELAYED_START, fire_at__lte=now)
    return runnable.exists() or due_starts.exists()


def cancelled_among(workflow_ids: list[str], using: str) -> set[str]:
    """Which of these workflows are cancelled.

    Args:
        workflow_ids: the workflows to look at.
        using: the connection alias.
    """
    rows = (
        Workflow.objects.using(using)
        .filter(id__in=workflow_ids, status=WorkflowStatus.CANCELLED)
        .values_list("id", flat=True)
    )
    return set(rows)


def run_of_unreadable(workflow_id: str, using: str) -> tuple[str, int] | None:
    """(run id, stuck attempts) of a workflow whose row the ORM cannot convert, read without the
    ORM's conversions; None when there is no such row or these two columns cannot be read either.

    Args:
        workflow_id: the workflow.
        using: the connection alias.

    Raises:
        DatabaseError: the database failed.
    """
    try:
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"SELECT run_id, stuck_attempts FROM {Workflow._meta.db_table} WHERE id = %s",
                [workflow_id],
            )
            row = cursor.fetchone()
    except DatabaseError:
        raise
    except Exception:
        return None
    if row is None:
        return None
    try:
        return str(uuid.UUID(str(row[0]))), int(row[1] or 0)
    except (ValueError, TypeError):
        return None


def complete_attempt(
    run_id: str, seq: int, attempt: int, epoch: int, result: str, completed_at: datetime, using: str
) -> bool:
    """Record an atomic activity's attempt as completed, inside the activity's own transaction (the
    caller locked the claim first). Returns whether the step still waited for this very attempt.

    Args:
        run_id: the run.
        seq: the step's position.
        attempt: the attempt number the step must still be running.
        epoch: the claim's epoch, recorded on the step.
        result: codec text of the activity's value.
        completed_at: when it completed (the database clock).
        using: the connection alias.
    """
    done = (
        Step.objects.using(using)
        .filter(run_id=run_id, seq=seq, status=StepStatus.RUNNING, attempts=attempt)
        .update(status=StepStatus.COMPLETED, result=result, error=None, epoch=epoch, completed_at=completed_at)
    )
    return done == 1
