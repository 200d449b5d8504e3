"""Forking a run (``weft.fork``): the source's recorded steps and the updates applied at them, read
and copied under a new run, in the transaction that creates it (``store.runs.create_run``)."""

from __future__ import annotations

from typing import Any

from ..models import AppliedUpdate, Step, Workflow, WorkflowAttribute, WorkflowClaim


def source(workflow_id: str, using: str) -> dict[str, Any] | None:
    """The fields a fork reads of run ``workflow_id`` (None: no such workflow)."""
    fields = (
        "id",
        "run_id",
        "workflow_type",
        "version",
        "input",
        "status",
        "trace_context",
        "execution_timeout",
        "started_at",
        "fork_origin",
    )
    found = Workflow.objects.using(using).filter(pk=workflow_id).values(*fields).first()
    return None if found is None else dict(found)


def recorded_steps(run_id: Any, using: str) -> list[tuple[int, str]]:
    """(seq, status) of every recorded step of a run, in seq order."""
    return list(Step.objects.using(using).filter(run_id=run_id).order_by("seq").values_list("seq", "status"))


def set_origin(workflow_id: str, origin: dict[str, Any] | None, using: str) -> None:
    """Write the new run's ``fork_origin`` (its source's values below the fork point), in the caller's
    transaction."""
    if origin is not None:
        Workflow.objects.using(using).filter(pk=workflow_id).update(fork_origin=origin)


def copy_history(source_id: str, source_run: Any, new_id: str, new_run: Any, upto: int, using: str) -> int:
    """Copy steps ``seq < upto`` of the source run, the updates applied at them, and the source's
    current search attributes to the new run (its claim's epoch on the steps), in the caller's
    transaction. Returns how many steps were copied."""
    epoch = WorkflowClaim.objects.using(using).filter(pk=new_id).values_list("epoch", flat=True).first() or 0
    steps = [
        Step(
            workflow_id=new_id,
            run_id=new_run,
            seq=step.seq,
            kind=step.kind,
            name=step.name,
            status=step.status,
            result=step.result,
            error=step.error,
            attempts=step.attempts,
            epoch=epoch,
            started_at=step.started_at,
            completed_at=step.completed_at,
        )
        for step in Step.objects.using(using).filter(run_id=source_run, seq__lt=upto).order_by("seq")
    ]
    Step.objects.using(using).bulk_create(steps)
    applied = [
        AppliedUpdate(
            workflow_id=new_id,
            run_id=new_run,
            seq=row.seq,
            n=row.n,
            name=row.name,
            payload=row.payload,
            result=row.result,
            error=row.error,
            update_id=None,
        )
        for row in AppliedUpdate.objects.using(using).filter(run_id=source_run, seq__lt=upto).order_by("seq", "n")
    ]
    if applied:
        AppliedUpdate.objects.using(using).bulk_create(applied)
    attributes = [
        WorkflowAttribute(
            workflow_id=new_id,
            name=row.name,
            position=row.position,
            kind=row.kind,
            str_value=row.str_value,
            num_value=row.num_value,
            time_value=row.time_value,
            bool_value=row.bool_value,
        )
        for row in WorkflowAttribute.objects.using(using).filter(workflow_id=source_id)
    ]
    if attributes:
        WorkflowAttribute.objects.using(using).bulk_create(attributes)
    return len(steps)


__all__ = ["copy_history", "recorded_steps", "set_origin", "source"]
