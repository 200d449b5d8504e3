"""The replay check: drive stored histories through the current code, in memory, without running
an activity, computing an unrecorded memo, or writing anything, and say which runs the engine could
not replay (``manage.py weft replay``, ``weft_django.testing.replay``).

A run fails the check when replaying it:

- gets it stuck: ``NonDeterminismError`` (the code yields another operation where the history has
  one recorded), ``CorruptPayloadError`` (a recorded row cannot be decoded), ``EngineInternalError``;
- finds no workflow for it: ``WorkflowNotRegisteredError``, ``VersionMismatchError``;
- ends differently from a run that has ended: a completed run whose code now fails, returns another
  result, or waits for more; a failed run whose code now completes or waits for more. (A cancelled,
  terminated or timed-out run ended from outside: only its recorded steps are checked.)

A run still open passes when the code reaches a frontier or completes there: that is what the
engine would do with it next. One whose code now fails is reported (``WorkflowFailedError``), even
right after its last recorded step: an open run a step away from failing is rare, new code that fails
it is not.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from .. import exceptions
from ..context import WorkflowContext
from ..exceptions import NonDeterminismError, WeftError
from ..registry import WorkflowDefinition, registry, resolve_workflow
from ..status import WorkflowStatus
from ..store.replay import StoredHistory
from .driver import WorkflowRun


@dataclasses.dataclass(frozen=True)
class ReplayOutcome:
    """How one stored run replays against the current code."""

    workflow_id: str
    run_id: str
    workflow_type: str
    ok: bool
    error_type: str = ""
    message: str = ""
    frontier: int | None = None  # the seq the replay stopped at (None: the code ended)

    def error(self) -> WeftError:
        """The failure as the exception ``weft_django.testing.replay`` raises (its type is
        ``error_type``, one of weft_django.exceptions)."""
        kind = getattr(exceptions, self.error_type, None)
        if isinstance(kind, type) and issubclass(kind, WeftError):
            return kind(self.message)
        return NonDeterminismError(self.message)


def definition_for(history: StoredHistory) -> WorkflowDefinition | ReplayOutcome:
    """The registered workflow this run replays with, or the failing outcome saying why there is none."""
    definition = registry.workflows.get((history.workflow_type, history.version))
    if definition is not None:
        return definition
    if history.workflow_type in registry.latest:
        kind = "VersionMismatchError"
        message = (
            f"Workflow {history.workflow_id!r} runs {history.workflow_type!r} version {history.version!r}, which this "
            f"code does not register (it has version {registry.latest[history.workflow_type].version!r}). Keep the "
            "old version registered until its runs end."
        )
    else:
        kind = "WorkflowNotRegisteredError"
        message = f"Workflow {history.workflow_id!r} runs {history.workflow_type!r}, which this code does not register."
    return _failed(history, kind, message)


def check(history: Any, workflow: Any) -> ReplayOutcome:
    """``weft_django.testing.replay``: replay one history with ``workflow`` and raise its failure.

    Args:
        history: what history_file.load takes (a dict, JSON text, a file's path, a StoredHistory).
        workflow: a @weft.workflow function, its definition or registered name, or a plain generator
            function (the new code under test, not registered).

    Raises:
        NonDeterminismError, CorruptPayloadError, WorkflowFailedError, ...: the run would fail
            (``ReplayOutcome.error_type`` names it).
        InvalidArgumentError: the history is not a ``weft-history/1`` object.
    """
    from ..history_file import load

    stored = load(history)
    if inspect.isgeneratorfunction(workflow) and getattr(workflow, "__weft_workflow__", None) is None:
        definition = WorkflowDefinition(workflow, stored.workflow_type, stored.version)
    else:
        definition = resolve_workflow(workflow)
    outcome = replay(stored, definition)
    if not outcome.ok:
        raise outcome.error()
    return outcome


def replay(history: StoredHistory, definition: WorkflowDefinition | None = None) -> ReplayOutcome:
    """Replay one stored run against the current code (``definition``, default: the registered one).
    Never raises for the run's own problems: they are the outcome. Nothing is written, no activity
    runs; the workflow's own code (and its update handlers, re-applied) does run, in memory.

    Args:
        history: the run (store/replay.py, or history_file.load).
        definition: the workflow to replay it with.
    """
    # A hand edit Python cannot read, in what the engine loads (not created_at): it makes the run stuck.
    damaged = {name: text for name, text in history.unreadable.items() if name != "created_at"}
    if damaged:
        held = "; ".join(f"{name}: {text}" for name, text in damaged.items())
        message = (
            f"Workflow {history.workflow_id!r}: its rows cannot be read by the engine ({held}: a value Python "
            "cannot represent). Repair the row, or cancel the workflow."
        )
        return _failed(history, "EngineInternalError", message)
    if definition is None:
        found = definition_for(history)
        if isinstance(found, ReplayOutcome):
            return found
        definition = found
    ctx = WorkflowContext(
        workflow_id=history.workflow_id,
        run_id=history.run_id,
        workflow_type=history.workflow_type,
        started_at=history.started_at,
        epoch=0,
    )
    run = WorkflowRun(definition, ctx, history.input, dict(history.steps), list(history.applied), history.fork_origin)
    run.occupied = {seq: history.timer_kinds.get(seq) for seq in history.timer_seqs}
    run.check_only = True
    try:
        run.start()
    finally:
        run.close()
    if run.stuck is not None:
        return _failed(history, type(run.stuck).__name__, str(run.stuck))
    frontier = run.frontier.seq if run.frontier is not None and not run.finished else None
    status = history.status
    if status == WorkflowStatus.COMPLETED:
        if run.failure is not None:
            return _failed(history, "WorkflowFailedError", _ends(history, "completed", f"fails ({_why(run.failure)})"))
        if run.result_text is None:
            return _failed(
                history, "NonDeterminismError", _ends(history, "completed", f"waits at step {frontier}"), frontier
            )
        if run.result_text != history.result:
            return _failed(history, "NonDeterminismError", _ends(history, "completed", "returns a different result"))
    elif status == WorkflowStatus.FAILED:
        if run.completed:
            return _failed(history, "NonDeterminismError", _ends(history, "failed", "completes"))
        if run.failure is None:
            return _failed(
                history, "NonDeterminismError", _ends(history, "failed", f"waits at step {frontier}"), frontier
            )
    elif run.failure is not None and status not in (WorkflowStatus.CANCELLED, WorkflowStatus.TIMED_OUT):
        message = f"Workflow {history.workflow_id!r}: the code now fails on replay ({_why(run.failure)})."
        return _failed(history, "WorkflowFailedError", message)
    return ReplayOutcome(history.workflow_id, history.run_id, history.workflow_type, True, frontier=frontier)


def _failed(history: StoredHistory, kind: str, message: str, frontier: int | None = None) -> ReplayOutcome:
    return ReplayOutcome(history.workflow_id, history.run_id, history.workflow_type, False, kind, message, frontier)


def _ends(history: StoredHistory, recorded: str, now: str) -> str:
    return (
        f"Workflow {history.workflow_id!r}: the recorded run {recorded}, but the current code {now} on replay of "
        "the same history."
    )


def _why(failure: dict[str, Any]) -> str:
    return f"{failure.get('type', 'Exception')}: {failure.get('message', '')}"
