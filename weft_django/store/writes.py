"""What a fenced commit writes: one workflow's writes (``WorkflowWrites``) and what came of them
(``FenceResult``). Plain data, shared by ``store.commit`` and ``store.commit_statement``."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Protocol

from ..models import Timer
from .children import ChildStart


class StepRecord(Protocol):
    """A step as the store writes it (the engine's ``engine.driver.StepRecord`` is one)."""

    @property
    def seq(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def result(self) -> str | None: ...
    @property
    def error(self) -> dict[str, Any] | None: ...
    @property
    def attempts(self) -> int: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def completed_at(self) -> datetime | None: ...
    @property
    def settled(self) -> bool: ...


class AppliedRecord(Protocol):
    """An applied update as the store writes it (the engine's ``engine.driver.AppliedRecord`` is one)."""

    @property
    def seq(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def payload(self) -> str: ...
    @property
    def result(self) -> str | None: ...
    @property
    def error(self) -> dict[str, Any] | None: ...
    @property
    def update_id(self) -> str | None: ...


@dataclasses.dataclass
class Finish:
    status: str  # a terminal status
    result: str | None = None
    error: dict[str, Any] | None = None


@dataclasses.dataclass
class Continuation:
    """A run that continues as new (ctx.continue_as_new): the next run of the same workflow id."""

    run_id: str  # the new run's id
    input_text: str  # codec text of {"args", "kwargs"}
    version: str  # the workflow version the new run runs (the latest registered)


@dataclasses.dataclass
class UpdateDone:
    """How the owner settled one admitted update: completed / rejected / failed (by its handler or
    validator), or accepted (a wait_for_update took its payload; respond() completes it later)."""

    update_id: str
    status: str
    result: str | None = None
    error: dict[str, Any] | None = None
    issues: list[dict[str, Any]] | None = None


@dataclasses.dataclass
class WorkflowWrites:
    """Everything one workflow wants committed in the next fenced commit."""

    workflow_id: str
    run_id: str
    epoch: int
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    timers_add: list[Timer] = dataclasses.field(default_factory=list)
    timers_delete: list[int] = dataclasses.field(default_factory=list)
    signals_consumed: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (signal pk, seq)
    finish: Finish | None = None
    stuck: dict[str, Any] | None = None  # {"error": {...}, "retry_at": datetime}
    children: list[ChildStart] = dataclasses.field(default_factory=list)
    parent: tuple[str, str, int] | None = None  # (parent id, parent run id, parent seq): told when we end
    clear_stuck: bool = False
    # Messages (engine/messages.py): admitted updates settled under this fence, the applied-update log
    # replay re-applies, and respond() answers of wait_for_update (update id, codec text of the result).
    updates_done: list[UpdateDone] = dataclasses.field(default_factory=list)
    applied: list[AppliedRecord] = dataclasses.field(default_factory=list)
    update_responses: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    # Search attributes (issue 19): each ctx.set_attributes call's checked values (name -> (kind, value),
    # None clears), in the order made; store/visibility.py writes them after the fence, last value wins.
    attributes: list[dict[str, tuple[str, Any] | None]] = dataclasses.field(default_factory=list)
    continued: Continuation | None = None  # this run ends by continuing as new (store/continuation.py)
    # Whether the run may have children to close when it ends: the engine sets False for a run with no
    # child step in its history (then its end skips the descendant queries); True is always safe.
    started_children: bool = True
    # Steps another transaction may settle (an atomic attempt commits its own step, and one of an older
    # context of this workflow may still do so after a reload at the same epoch): seq -> the attempt
    # this context believes is running. If such a step is no longer running at that attempt when the
    # fence is taken, nothing of this workflow is written (FenceResult.stale): a settled step is never
    # overwritten (store/commit.settled_elsewhere).
    guards: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (
            self.steps
            or self.updates_done
            or self.applied
            or self.update_responses
            or self.timers_add
            or self.timers_delete
            or self.signals_consumed
            or self.finish
            or self.continued
            or self.stuck
            or self.clear_stuck
            or self.attributes
        )


@dataclasses.dataclass
class FenceResult:
    committed: set[str]
    lost: dict[str, str]  # workflow id -> "deposed" | "released" | "missing"
    children: dict[str, int] = dataclasses.field(default_factory=dict)  # children started: id -> epoch
    # Still ours, but a row the commit needed (the claim, or a child's claim that a finishing run
    # closes) was locked by another transaction: nothing of theirs was written; retry next pass.
    busy: set[str] = dataclasses.field(default_factory=set)
    # Still ours, but a guarded step (WorkflowWrites.guards) was settled by another transaction: nothing
    # of theirs was written; their context is stale, reload it from the durable log.
    stale: set[str] = dataclasses.field(default_factory=set)


class UpdateRaceLost(Exception):
    """An update the owner settled was no longer admitted at commit time: roll everything back."""


def latest_per_seq(steps: list[StepRecord]) -> list[StepRecord]:
    """A step may be recorded twice before a commit (dispatched, then settled): keep its last state, since
    one upsert statement may not touch a row twice."""
    return list({step.seq: step for step in steps}.values())
