"""``weft.fork``: a new run that reuses the first N recorded steps of another and runs the rest on
the current code (after a bug fix), like DBOS's fork_workflow and Temporal's reset."""

from __future__ import annotations

import uuid
from typing import Any

from asgiref.sync import sync_to_async

from . import events, transitions
from .client.handles import WorkflowHandle
from .conf import database_alias
from .deterministic import Lineage
from .exceptions import CorruptPayloadError, InvalidForkError, WorkflowAlreadyExistsError, WorkflowNotFoundError
from .queueing import queue_options
from .registry import registry
from .status import StepStatus
from .store import forks, runs
from .validation import validate_workflow_id

_SETTLED = (StepStatus.COMPLETED, StepStatus.FAILED)


def fork(workflow_id: str, *, from_step: int, new_id: str | None = None) -> WorkflowHandle:
    """Start a new run (a new workflow id) of the workflow ``workflow_id`` runs, with the same input,
    whose first ``from_step`` recorded steps (seq 0 .. from_step - 1) are copied from it: replay
    returns their recorded results and the code runs on from there with the version registered now.
    Below the fork point the new run's ``ctx.random()``, ``ctx.uuid4()`` and ``ctx.now()`` give the
    source's values (its seeds and start time); from it on, its own. The source is not changed. The new
    run is top-level (no parent, no schedule) and starts with the
    source's search attributes (replay sets them again as the code does) and its ``execution_timeout``
    (counted from the fork's start, as a start's). A workflow declared with ``@weft.workflow(queue=)``
    forks into its queue: the new run waits ``pending`` until admitted. The source's claim (then its
    row) is locked while it is read, so a purge, retry or start_new of it waits and the steps checked
    are the steps copied. Joins the caller's transaction, like ``weft.start``; outside one, its own
    transaction is retried after a deadlock (a start_many inserting the new id while replacing the source).

    Args:
        workflow_id: the run to fork (its latest run).
        from_step: how many recorded steps to keep: 0 re-runs everything.
        new_id: the new workflow id (default: a generated one).

    Raises:
        WorkflowNotFoundError: no workflow ``workflow_id``.
        InvalidForkError: ``from_step`` is not a whole number >= 0, is beyond the recorded steps, or
            keeps a step that has not settled (a running attempt, a wait); or the source's own fork
            origin is damaged (a hand edit).
        WorkflowAlreadyExistsError: ``new_id`` is taken.
        WorkflowNotRegisteredError: the workflow's type is not registered in this process.
        UnknownQueueError: the workflow's queue is not in WEFT["QUEUES"] (nothing is written).
    """
    validate_workflow_id(workflow_id)
    if new_id is not None:
        validate_workflow_id(new_id, "new_id")
    if isinstance(from_step, bool) or not isinstance(from_step, int) or from_step < 0:
        raise InvalidForkError(f"from_step must be a whole number >= 0 (got {from_step!r}).")
    using = database_alias()

    def body() -> str:
        # The source's claim, then its row, locked first: a purge, retry or start_new of it waits, so
        # the steps checked are the steps copied.
        transitions.lock_workflow(workflow_id, using)
        row = forks.source(workflow_id, using)
        if row is None:
            raise WorkflowNotFoundError(f'No workflow "{workflow_id}" exists (never started, or purged). Check the id.')
        _check_steps(workflow_id, forks.recorded_steps(row["run_id"], using), from_step)
        # Below the fork point the kept steps replay as the source's did: its ctx.random() seeds and
        # ctx.now() start (deterministic.Lineage; a fork of a fork keeps the earlier sources' too).
        try:
            lineage = Lineage.from_json(row["fork_origin"], str(row["run_id"]))
        except CorruptPayloadError as exc:
            raise InvalidForkError(f'Workflow "{workflow_id}" cannot be forked: {exc}.') from None
        definition = registry.workflow(row["workflow_type"])
        target = new_id if new_id is not None else str(uuid.uuid4())
        new_run = uuid.uuid4()
        # the workflow's @weft.workflow(queue=): the fork waits there, as a start()'s run would
        queue, priority, key = queue_options(definition, None, None, None, delayed=False)
        new = runs.NewRun(
            workflow_id=target,
            workflow_type=definition.name,
            version=definition.version,
            input_text=row["input"],
            execution_timeout=row["execution_timeout"],  # counted from the fork's start, as a start's
            run_id=new_run,
            queue=queue,
            priority=priority,
            concurrency_key=key,
        )
        created = runs.create_run(new, using)
        if created is None:
            raise WorkflowAlreadyExistsError(f'Workflow "{target}" already exists; pass another new_id (or none).')
        forks.copy_history(workflow_id, row["run_id"], target, new_run, from_step, using)
        forks.set_origin(
            target, lineage.forked(str(row["run_id"]), row["started_at"], from_step).to_json(str(new_run)), using
        )
        events.workflow_started(created, using)
        return target

    # Its own transaction (retried after a deadlock: a start_many inserting the new id and replacing the
    # source waits for the source's claim this holds while this waits for that insert).
    target = transitions.run_in_transaction(using, body, lock=[workflow_id])
    return WorkflowHandle(target)


def _check_steps(workflow_id: str, recorded: list[tuple[int, str]], from_step: int) -> None:
    by_seq = dict(recorded)
    if from_step > len(recorded) or any(seq not in by_seq for seq in range(from_step)):
        raise InvalidForkError(
            f'Workflow "{workflow_id}" has {len(recorded)} recorded steps; from_step={from_step} is beyond them '
            f"(use 0 to {len(recorded)})."
        )
    unsettled = [seq for seq in range(from_step) if by_seq[seq] not in _SETTLED]
    if unsettled:
        raise InvalidForkError(
            f'Workflow "{workflow_id}": step {unsettled[0]} has not settled ({by_seq[unsettled[0]]}); fork from a '
            f"step before it (from_step <= {unsettled[0]})."
        )


async def afork(workflow_id: str, **options: Any) -> WorkflowHandle:
    """Async twin of :func:`fork`."""
    return await sync_to_async(fork)(workflow_id, **options)


__all__ = ["afork", "fork"]
