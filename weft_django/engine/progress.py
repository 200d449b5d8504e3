"""How an owned workflow makes progress: arming the operations at its frontier (activity attempts,
timers, signal waits), settling them from activity outcomes, timer fires and buffered signals, and
turning each settlement into writes for the next fenced commit. Mixed into Engine."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from django.db import DatabaseError, connections

from .. import prepared
from ..clock import db_now
from ..codec import encode
from ..exceptions import ActivityTimeoutError, WeftError
from ..models import AppliedUpdate, BufferedSignal, PendingUpdate, Step, Timer, Workflow
from ..operations import RunActivity, Sleep, StartChild, WaitForSignal, WaitForUpdate, WaitUntil
from ..status import SignalState, StepStatus, TimerKind, UpdateStatus, WorkflowStatus
from .activities import AttemptOutcome, AttemptTask, FenceRefused
from .children import MAX_DEPTH, ChildStart, child_outcome, mailbox_name
from .driver import AppliedRecord, Leaf, StepRecord, WorkflowRun
from .executors import ActivityExecutors
from .fencing import BUFFERED_STATE_SQL, Finish, WorkflowWrites, lock_claims
from .timers import TimerHeap

logger = logging.getLogger("weft_django.engine.engine")


@dataclasses.dataclass
class Owned:
    """A workflow this engine holds, with its live generator and what it waits for."""

    workflow_id: str
    run_id: str
    epoch: int
    run: WorkflowRun
    timers: dict[tuple[str, int], Timer] = dataclasses.field(default_factory=dict)
    inflight: dict[int, AttemptTask] = dataclasses.field(default_factory=dict)
    armed: set[int] = dataclasses.field(default_factory=set)
    dispatch: list[AttemptTask] = dataclasses.field(default_factory=list)
    stuck_attempts: int = 0
    clear_stuck: bool = False
    parent: tuple[str, str, int] | None = None  # (id, run id, seq) of the parent step waiting for us
    armed_at: dict[int, datetime] = dataclasses.field(default_factory=dict)  # when each wait began
    depth: int = 0


class Progress:
    """The per-workflow half of the engine loop (state lives on Engine)."""

    owned: dict[str, Owned]
    timers: TimerHeap
    executor: ActivityExecutors
    engine_id: str
    using: str
    _lock: threading.Lock
    _notified: set[str]
    _wake: threading.Event
    stopping: threading.Event
    refused_commits: int
    _reload: dict[str, int]

    def _stuck(
        self,
        wid: str,
        run_id: str,
        epoch: int,
        attempts: int,
        error: WeftError,
        now: datetime,
        writes: dict[str, WorkflowWrites],
    ) -> None:
        raise NotImplementedError  # provided by Engine

    def _drop(self, wid: str, reason: str | None) -> None:
        raise NotImplementedError  # provided by Engine

    # -- effects of a generator's new frontier ------------------------------------------------------
    def _writes(self, owned: Owned, writes: dict[str, WorkflowWrites]) -> WorkflowWrites:
        w = writes.get(owned.workflow_id)
        if w is None:
            w = writes[owned.workflow_id] = WorkflowWrites(
                owned.workflow_id, owned.run_id, owned.epoch, parent=owned.parent
            )
        return w

    def _restore_wait_starts(self, owned: Owned, run_started_at: datetime | None) -> None:
        """After a load (a takeover, a restart): when each wait pending at the replayed frontier began,
        which its step records as ``started_at`` when it settles (the admin's timeline). A sleep or a
        signal wait with a timeout began when its timer was armed (fire time - duration); any other
        wait when the workflow reached that frontier: the latest end of the steps before it (the run's
        start for a first wait). A sleep or timed wait whose timer was never armed begins now, when
        this engine arms it (its timer is armed from now too)."""
        frontier = owned.run.frontier
        if frontier is None or not frontier.leaves:
            return
        first = min(leaf.seq for leaf in frontier.leaves)
        ends = [step.completed_at for seq, step in owned.run.steps.items() if seq < first and step.completed_at]
        reached = max(ends, default=run_started_at)
        for leaf in owned.run.pending_leaves():
            op, began = leaf.op, reached
            if isinstance(op, Sleep):
                timer = owned.timers.get((TimerKind.SLEEP, leaf.seq))
                began = timer.fire_at - op.duration if timer is not None else None
            elif isinstance(op, WaitForSignal) and op.timeout is not None:
                timer = owned.timers.get((TimerKind.SIGNAL_TIMEOUT, leaf.seq))
                began = timer.fire_at - op.timeout if timer is not None else None
            if began is not None and not isinstance(op, RunActivity):
                owned.armed_at[leaf.seq] = began

    def _collect_recorded(self, owned: Owned, writes: dict[str, WorkflowWrites]) -> None:
        """Move what the generator recorded by itself (memo steps, respond() answers of
        wait_for_update) into this workflow's writes for the next fenced commit."""
        run = owned.run
        if run.new_steps:
            self._writes(owned, writes).steps.extend(run.new_steps)
            run.new_steps = []
        if run.responses:
            self._writes(owned, writes).update_responses.extend(run.responses)
            run.responses = []

    def _advance_effects(self, wid: str, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]) -> None:
        owned = self.owned.get(wid)
        if owned is None:
            return
        run = owned.run
        self._collect_recorded(owned, writes)
        if run.finished:
            w = self._writes(owned, writes)
            if run.stuck is not None:
                self._stuck(wid, owned.run_id, owned.epoch, owned.stuck_attempts, run.stuck, now, writes)
            elif run.completed:
                w.finish = Finish(WorkflowStatus.COMPLETED, result=run.result_text)
            else:
                w.finish = Finish(WorkflowStatus.FAILED, error=run.failure)
            for task in owned.inflight.values():
                task.control.request_stop("the workflow finished")
            return
        for leaf in run.pending_leaves():
            if leaf.seq in owned.armed:
                continue
            owned.armed.add(leaf.seq)
            owned.armed_at.setdefault(leaf.seq, now)
            op = leaf.op
            if isinstance(op, RunActivity):
                self._arm_activity(owned, leaf.seq, op, now, writes)
            elif isinstance(op, Sleep):
                self._arm_timer(owned, TimerKind.SLEEP, leaf.seq, now + op.duration, writes)
            elif isinstance(op, WaitForSignal):
                if op.timeout is not None:
                    self._arm_timer(owned, TimerKind.SIGNAL_TIMEOUT, leaf.seq, now + op.timeout, writes)
                with self._lock:
                    self._notified.add(wid)  # look for a buffered signal on the next pass
                self._wake.set()
            elif isinstance(op, StartChild):
                self._arm_child(owned, leaf.seq, op, now, writes, changed)
            elif isinstance(op, WaitUntil):
                self._check_wait_until(owned, leaf.seq, op, now, writes, changed)
            elif isinstance(op, WaitForUpdate):
                with self._lock:
                    self._notified.add(wid)  # look for an admitted update on the next pass
                self._wake.set()

    def _arm_activity(
        self, owned: Owned, seq: int, op: RunActivity, now: datetime, writes: dict[str, WorkflowWrites]
    ) -> None:
        step = owned.run.steps.get(seq)
        if step is None:
            step = StepRecord(seq, "activity", op.name, StepStatus.RUNNING, attempts=1, started_at=now)
            owned.run.record(step)
            self._writes(owned, writes).steps.append(step)
        elif (TimerKind.ACTIVITY_RETRY, seq) in owned.timers:
            timer = owned.timers[(TimerKind.ACTIVITY_RETRY, seq)]
            self.timers.push(timer.fire_at, owned.workflow_id, TimerKind.ACTIVITY_RETRY, seq)
            return
        # A recovered attempt runs again under the same attempt number.
        owned.dispatch.append(self._task(owned, seq, op, step.attempts, step.started_at or now))

    def _arm_child(
        self,
        owned: Owned,
        seq: int,
        op: StartChild,
        now: datetime,
        writes: dict[str, WorkflowWrites],
        changed: set[str],
    ) -> None:
        """Start the child in this workflow's next fenced commit (unless a recorded step says it was
        started already); its end arrives as a child-terminal record in our mailbox."""
        with self._lock:
            self._notified.add(owned.workflow_id)  # its record may be waiting already
        if owned.run.steps.get(seq) is not None:
            return
        child_id = op.child_id or f"{owned.workflow_id}/{seq}"
        step = StepRecord(seq, "child", op.name, StepStatus.RUNNING, encode(child_id), attempts=1, started_at=now)
        owned.run.record(step)
        w = self._writes(owned, writes)
        w.steps.append(step)
        if owned.depth + 1 > MAX_DEPTH:
            report = {
                "type": "ChildWorkflowError",
                "message": f"child workflows nest at most {MAX_DEPTH} deep; "
                f"{child_id!r} would be level {owned.depth + 1}",
            }
            self._settle(
                owned,
                dataclasses.replace(
                    step,
                    status="failed",
                    error={
                        "exc": "ChildWorkflowError",
                        "message": report["message"],
                        "child_id": child_id,
                        "status": "failed",
                        "error": report,
                    },
                    completed_at=now,
                ),
                writes,
                changed,
            )
            return
        w.children.append(
            ChildStart(
                child_id=child_id,
                workflow_type=op.workflow_type,
                version=op.version,
                input_text=op.input_text,
                parent_id=owned.workflow_id,
                parent_run_id=owned.run_id,
                parent_seq=seq,
                parent_close_policy=op.parent_close_policy,
                depth=owned.depth + 1,
            )
        )

    def _task(self, owned: Owned, seq: int, op: RunActivity, attempt: int, started_at: datetime) -> AttemptTask:
        timeout = op.activity.timeout
        return AttemptTask(
            workflow_id=owned.workflow_id,
            run_id=owned.run_id,
            seq=seq,
            attempt=attempt,
            epoch=owned.epoch,
            definition=op.activity,
            args_text=op.args_text,
            started_at=started_at,
            # Provisional: the executor restarts it when the attempt really starts (the thread pool
            # when a thread picks it up, Celery when the message is sent).
            deadline=time.monotonic() + timeout.total_seconds() if timeout else None,
        )

    def _arm_timer(
        self,
        owned: Owned,
        kind: str,
        seq: int,
        fire_at: datetime,
        writes: dict[str, WorkflowWrites],
        attempt: int | None = None,
    ) -> None:
        existing = owned.timers.get((kind, seq))
        if existing is not None:  # recorded before a crash: keep its original fire time
            self.timers.push(existing.fire_at, owned.workflow_id, kind, seq)
            return
        timer = Timer(
            workflow_id=owned.workflow_id,
            run_id=owned.run_id,
            kind=kind,
            seq=seq,
            attempt=attempt,
            fire_at=fire_at,
        )
        owned.timers[(kind, seq)] = timer
        self._writes(owned, writes).timers_add.append(timer)
        self.timers.push(fire_at, owned.workflow_id, kind, seq)

    def _take_timer(self, owned: Owned, kind: str, seq: int, writes: dict[str, WorkflowWrites]) -> Timer | None:
        timer = owned.timers.pop((kind, seq), None)
        if timer is not None:
            w = self._writes(owned, writes)
            if timer.pk is not None:
                w.timers_delete.append(timer.pk)
            elif timer in w.timers_add:
                w.timers_add.remove(timer)
        return timer

    def _settle(self, owned: Owned, step: StepRecord, writes: dict[str, WorkflowWrites], changed: set[str]) -> None:
        began = owned.armed_at.pop(step.seq, None)
        if step.started_at is None and began is not None:
            step.started_at = began  # a wait's step spans from when it began (the admin's timeline)
        owned.run.record(step)
        self._writes(owned, writes).steps.append(step)
        owned.armed.discard(step.seq)
        owned.run.settle(step.seq, step.outcome)
        changed.add(owned.workflow_id)

    def _check_wait_until(
        self,
        owned: Owned,
        seq: int,
        op: WaitUntil,
        now: datetime,
        writes: dict[str, WorkflowWrites],
        changed: set[str],
    ) -> None:
        try:
            satisfied = bool(op.predicate())
        except Exception as exc:
            logger.warning("wait_until predicate raised workflow=%s error=%s", owned.workflow_id, exc)
            satisfied = False
        if satisfied:
            self._take_timer(owned, TimerKind.WAIT_CONDITION, seq, writes)
            self._settle(
                owned,
                StepRecord(seq, "wait_until", "", "completed", "true", completed_at=now),
                writes,
                changed,
            )
        elif op.timeout is not None:
            self._arm_timer(owned, TimerKind.WAIT_CONDITION, seq, now + op.timeout, writes)

    def _recheck_wait_until(
        self, owned: Owned, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]
    ) -> None:
        """After an update handler ran: settle the armed wait_until leaves whose predicate holds now.
        (Signals do not re-drive a wait_until, as in weft; its timeout timer stays armed otherwise.)"""
        for leaf in owned.run.pending_leaves():
            if not isinstance(leaf.op, WaitUntil) or leaf.seq not in owned.armed:
                continue
            try:
                satisfied = bool(leaf.op.predicate())
            except Exception as exc:
                logger.warning("wait_until predicate raised workflow=%s error=%s", owned.workflow_id, exc)
                continue
            if satisfied:
                self._take_timer(owned, TimerKind.WAIT_CONDITION, leaf.seq, writes)
                step = StepRecord(leaf.seq, "wait_until", "", "completed", "true", completed_at=now)
                self._settle(owned, step, writes, changed)

    # -- activity outcomes ---------------------------------------------------------------------------
    def _drain_outcomes(self) -> list[AttemptOutcome]:
        outcomes = []
        while True:
            try:
                outcomes.append(self.executor.outcomes.get_nowait())
            except Exception:
                return outcomes

    def _on_outcome(
        self, outcome: AttemptOutcome, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]
    ) -> None:
        task = outcome.task
        owned = self.owned.get(task.workflow_id)
        current = owned.inflight.get(task.seq) if owned else None
        # The very task dispatched for this context, not one with an equal key: after a reload at the
        # same epoch, the old context's attempt has the new one's (run, seq, attempt, epoch).
        if owned is None or current is not task:
            logger.info(
                "late activity result discarded workflow=%s seq=%s attempt=%s epoch=%s",
                task.workflow_id,
                task.seq,
                task.attempt,
                task.epoch,
            )
            return
        del owned.inflight[task.seq]
        if outcome.refused:
            self.refused_commits += 1
            # Reloaded from the durable log at the same epoch (if the claim is not ours any more, the
            # next fenced commit says so), not left to wait for its own claim to expire.
            self._reload[owned.workflow_id] = owned.epoch
            self._drop(owned.workflow_id, reason="an atomic activity's commit was refused; reloading")
            return
        if outcome.ok:
            step = StepRecord(
                task.seq,
                "activity",
                task.definition.name,
                "completed",
                outcome.result,
                attempts=task.attempt,
                started_at=task.started_at,
                completed_at=now,
            )
            if outcome.committed:
                owned.run.record(step)
                owned.armed.discard(task.seq)
                owned.run.settle(task.seq, step.outcome)
                changed.add(owned.workflow_id)
            else:
                self._settle(owned, step, writes, changed)
            return
        self._on_failure(owned, task, outcome.error or {}, outcome.retryable, now, writes, changed)

    def _on_failure(
        self,
        owned: Owned,
        task: AttemptTask,
        error: dict[str, Any],
        retryable: bool,
        now: datetime,
        writes: dict[str, WorkflowWrites],
        changed: set[str],
    ) -> None:
        policy = task.definition.retry
        budget = task.definition.schedule_to_close_timeout
        if retryable and task.attempt < policy.attempts:
            fire_at = now + policy.backoff(task.attempt)
            if budget is None or fire_at < task.started_at + budget:
                self._arm_timer(owned, TimerKind.ACTIVITY_RETRY, task.seq, fire_at, writes, attempt=task.attempt + 1)
                return
        step = StepRecord(
            task.seq,
            "activity",
            task.definition.name,
            "failed",
            error={
                "exc": "ActivityError",
                **error,
                "attempts": task.attempt,
                "activity": task.definition.name,
            },
            attempts=task.attempt,
            started_at=task.started_at,
            completed_at=now,
        )
        self._settle(owned, step, writes, changed)

    def _expire_attempts(self, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]) -> None:
        clock = time.monotonic()
        for owned in list(self.owned.values()):
            for seq, task in list(owned.inflight.items()):
                if task.deadline is None or clock < task.deadline:
                    continue
                # An atomic attempt that is committing right now holds this lock: let it finish.
                if not task.control.lock.acquire(blocking=False):
                    continue
                try:
                    if task.control.finished:
                        continue
                    task.control.request_stop("the attempt timed out")
                finally:
                    task.control.lock.release()
                del owned.inflight[seq]
                error = {
                    "type": "ActivityTimeoutError",
                    "qualified_type": "weft_django.exceptions.ActivityTimeoutError",
                    "message": f"attempt {task.attempt} did not finish within {task.definition.timeout}",
                    "traceback": "",
                }
                retryable = task.definition.retry.is_retryable(ActivityTimeoutError(error["message"]))
                self._on_failure(owned, task, error, retryable, now, writes, changed)

    # -- timers and signals ----------------------------------------------------------------------
    def _on_timer(
        self,
        wid: str,
        kind: str,
        seq: int,
        now: datetime,
        writes: dict[str, WorkflowWrites],
        changed: set[str],
    ) -> None:
        owned = self.owned.get(wid)
        if owned is None:
            return
        if kind == TimerKind.EXECUTION_DEADLINE:
            self._writes(owned, writes).finish = Finish(
                WorkflowStatus.TIMED_OUT,
                error={"type": "WorkflowTimedOutError", "message": "The run passed its execution timeout."},
            )
            owned.run.close()
            return
        if (kind, seq) not in owned.timers or not owned.run.is_pending(seq):
            return
        timer = self._take_timer(owned, kind, seq, writes)
        if kind == TimerKind.SLEEP:
            self._settle(owned, StepRecord(seq, "sleep", "", "completed", "null", completed_at=now), writes, changed)
        elif kind == TimerKind.SIGNAL_TIMEOUT:
            leaf_op = next(leaf.op for leaf in owned.run.pending_leaves() if leaf.seq == seq)
            message = f"No signal {leaf_op.name!r} arrived within the timeout."
            error = {"exc": "WaitTimeoutError", "message": message}
            self._settle(
                owned,
                StepRecord(seq, "signal", leaf_op.name, "failed", error=error, completed_at=now),
                writes,
                changed,
            )
        elif kind == TimerKind.WAIT_CONDITION:
            self._settle(
                owned,
                StepRecord(seq, "wait_until", "", "completed", "false", completed_at=now),
                writes,
                changed,
            )
        elif kind == TimerKind.ACTIVITY_RETRY and timer is not None:
            leaf_op = next(leaf.op for leaf in owned.run.pending_leaves() if leaf.seq == seq)
            assert isinstance(leaf_op, RunActivity)
            step = owned.run.steps[seq]
            step.attempts = timer.attempt or step.attempts + 1
            self._writes(owned, writes).steps.append(step)  # the attempt count is durable before dispatch
            owned.dispatch.append(self._task(owned, seq, leaf_op, step.attempts, step.started_at or now))

    def _deliver_signals(
        self, workflow_ids: set[str], now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]
    ) -> bool:
        waiting = {
            wid: [
                leaf for leaf in self.owned[wid].run.pending_leaves() if isinstance(leaf.op, WaitForSignal | StartChild)
            ]
            for wid in workflow_ids
            if wid in self.owned
        }
        waiting = {wid: leaves for wid, leaves in waiting.items() if leaves}
        if not waiting:
            return False
        delivered = False
        buffered = buffered_signals(list(waiting), self.using)
        taken: set[int] = set()
        for pk, wid, run_id, name, payload in buffered:
            owned = self.owned[wid]
            if str(run_id) != owned.run_id or pk in taken:
                continue
            leaf = next((lf for lf in waiting[wid] if mailbox_of(lf) == name and owned.run.is_pending(lf.seq)), None)
            if leaf is None:
                continue
            taken.add(pk)
            delivered = True
            self._writes(owned, writes).signals_consumed.append((pk, leaf.seq))
            if isinstance(leaf.op, StartChild):
                outcome = child_outcome(payload)
                step = StepRecord(
                    leaf.seq,
                    "child",
                    leaf.op.name,
                    "completed" if outcome.ok else "failed",
                    outcome.text,
                    outcome.error,
                    attempts=1,
                    completed_at=now,
                )
            else:
                self._take_timer(owned, TimerKind.SIGNAL_TIMEOUT, leaf.seq, writes)
                step = StepRecord(leaf.seq, "signal", name, "completed", payload, completed_at=now)
            self._settle(owned, step, writes, changed)
            waiting[wid] = [lf for lf in waiting[wid] if lf.seq != leaf.seq]
        return delivered

    def _commit_atomic_step(self, task: AttemptTask, result: str) -> None:
        """Called inside an atomic activity's transaction, after the user's writes: lock the claim
        last (it still conflicts with a takeover), check that the step still waits for this very
        attempt, and write the step in the same transaction. Otherwise raise FenceRefused: the user's
        writes roll back."""
        if not lock_claims(self.engine_id, {task.workflow_id: task.epoch}, self.using):
            raise FenceRefused("claim")
        waiting = (
            Step.objects.using(self.using)
            .filter(run_id=task.run_id, seq=task.seq, status=StepStatus.RUNNING, attempts=task.attempt)
            .update(
                status=StepStatus.COMPLETED,
                result=result,
                error=None,
                epoch=task.epoch,
                completed_at=db_now(self.using),
            )
        )
        if waiting != 1:
            raise FenceRefused("attempt")


class RunRow(NamedTuple):
    """The columns of a claimed run the engine reads to start driving it (a Workflow row, without
    building a model instance per run: loading runs is on the claim path of every tick)."""

    id: str
    run_id: str
    workflow_type: str
    version: str
    status: str
    input: str
    started_at: datetime | None
    execution_deadline: datetime | None
    stuck_error: Any
    stuck_attempts: int
    parent_id: str | None
    parent_run_id: str | None
    parent_seq: int | None
    depth: int


class AdmittedRow(NamedTuple):
    """An admitted update as deliver_updates reads it: ids as strings, in (created_at, id) order."""

    id: str
    workflow_id: str
    run_id: str
    name: str


class Loaded(NamedTuple):
    """What the engine reads to start driving freshly claimed workflows (``load``)."""

    runs: dict[str, RunRow]  # workflow id -> its current run
    steps: dict[str, dict[int, StepRecord]]  # run id -> {seq: step}
    applied: dict[str, list[AppliedRecord]]  # run id -> the updates replay re-applies
    timers: dict[str, list[Timer]]  # workflow id -> its timers
    admitted: dict[str, list[AdmittedRow]] | None  # workflow id -> admitted updates; None: not read


# Column lists and the row decoders are shared by both vendors' paths (one statement batch on
# PostgreSQL, separate queries on SQLite), so the two cannot drift.
_RUN_COLUMNS = ", ".join(RunRow._fields)
_STEP_COLUMNS = "run_id, seq, kind, name, status, result, error, attempts, started_at, completed_at"
_APPLIED_COLUMNS = "run_id, seq, n, name, payload, result, error, update_id"
_TIMER_FIELDS = [field.attname for field in Timer._meta.concrete_fields]  # Timer.from_db's positional order
_TIMER_COLUMNS = ", ".join(str(field.column) for field in Timer._meta.concrete_fields)
_ADMITTED_COLUMNS = "id, workflow_id, run_id, name"


def _runs_sql(marks: str) -> str:
    return f"SELECT {_RUN_COLUMNS} FROM {Workflow._meta.db_table} WHERE id IN ({marks})"


def _steps_sql(runs: str) -> str:
    return f"SELECT {_STEP_COLUMNS} FROM {Step._meta.db_table} WHERE run_id IN ({runs})"


def _applied_sql(runs: str) -> str:
    return f"SELECT {_APPLIED_COLUMNS} FROM {AppliedUpdate._meta.db_table} WHERE run_id IN ({runs}) ORDER BY seq, n"


def _timers_sql(marks: str) -> str:
    return f"SELECT {_TIMER_COLUMNS} FROM {Timer._meta.db_table} WHERE workflow_id IN ({marks})"


def _admitted_sql(marks: str) -> str:
    return (
        f"SELECT {_ADMITTED_COLUMNS} FROM {PendingUpdate._meta.db_table} "
        f"WHERE workflow_id IN ({marks}) AND status = %s ORDER BY created_at, id"
    )


_BUFFERED_SQL = (
    f"SELECT id, workflow_id, run_id, name, payload FROM {BufferedSignal._meta.db_table} "
    f"WHERE {BUFFERED_STATE_SQL} AND workflow_id = ANY(%s) ORDER BY id"
)


def buffered_signals(workflow_ids: list[str], using: str) -> list[tuple[int, str, Any, str, str]]:
    """The buffered signals of these workflows, oldest first: (id, workflow id, run id, name, payload).
    On PostgreSQL one prepared statement (a signal's wake-up pass runs it; the ORM's compile alone
    took longer than the round trip)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        rows = (
            BufferedSignal.objects.using(using)
            .filter(workflow_id__in=workflow_ids, state=SignalState.BUFFERED)
            .order_by("id")
            .values_list("id", "workflow_id", "run_id", "name", "payload")
        )
        return list(rows)
    with connection.cursor() as cursor:
        prepared.execute(cursor, connection, _BUFFERED_SQL, [workflow_ids])
        return list(cursor.fetchall())


def _uuid_text(value: Any) -> str:
    return str(uuid.UUID(str(value)))  # uuid on PostgreSQL, hex text on SQLite


def _decode_runs(values: list[Any], connection: Any, into: dict[str, RunRow]) -> None:
    for columns in values:
        row = RunRow(*columns)
        into[row.id] = row._replace(
            run_id=_uuid_text(row.run_id),
            parent_run_id=_uuid_text(row.parent_run_id) if row.parent_run_id else None,
            started_at=_aware(row.started_at, connection),
            execution_deadline=_aware(row.execution_deadline, connection),
            stuck_error=_json_value(row.stuck_error),
        )


def _decode_steps(values: list[Any], connection: Any, into: dict[str, dict[int, StepRecord]]) -> None:
    for run_id, seq, kind, name, status, result, error, attempts, started, completed in values:
        steps = into.get(_uuid_text(run_id))
        if steps is None:  # a run that began after the runs were read (PostgreSQL: a later statement)
            continue
        steps[seq] = StepRecord(
            seq,
            kind,
            name,
            status,
            result,
            _json_value(error),
            attempts,
            _aware(started, connection),
            _aware(completed, connection),
        )


def _decode_applied(values: list[Any], into: dict[str, list[AppliedRecord]]) -> None:
    for run_id, seq, n, name, payload, result, error, update_id in values:
        record = AppliedRecord(
            seq, n, name, payload, result, _json_value(error), _uuid_text(update_id) if update_id else None
        )
        into.setdefault(_uuid_text(run_id), []).append(record)


def _decode_timers(values: list[Any], connection: Any, using: str, into: dict[str, list[Timer]]) -> None:
    """Timer instances as the ORM builds them (no query: from_db marks them saved, on ``using``)."""
    for columns in values:
        fields = dict(zip(_TIMER_FIELDS, columns, strict=True))
        fields["run_id"] = uuid.UUID(str(fields["run_id"])) if fields["run_id"] else None
        fields["fire_at"] = _aware(fields["fire_at"], connection)
        timer = Timer.from_db(using, _TIMER_FIELDS, [fields[name] for name in _TIMER_FIELDS])
        into.setdefault(timer.workflow_id, []).append(timer)


def _decode_admitted(values: list[Any], into: dict[str, list[AdmittedRow]]) -> None:
    for pk, wid, run_id, name in values:
        into.setdefault(wid, []).append(AdmittedRow(_uuid_text(pk), wid, _uuid_text(run_id), name))


def load(workflow_ids: list[str], using: str) -> Loaded:
    """Everything needed to start driving these claimed workflows. On PostgreSQL (psycopg 3 binding
    parameters client-side, Django's default) one round trip per chunk of ids: runs, steps, applied
    updates, timers and admitted updates in one ``execute``. Elsewhere one query each, and admitted
    updates are left to deliver_updates (``admitted`` is None)."""
    connection = connections[using]
    if workflow_ids and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            if _client_binding(cursor):
                return _load_batched(cursor, workflow_ids, connection, using)
    runs = load_runs(workflow_ids, using)
    run_ids = [row.run_id for row in runs.values()]
    steps, applied = load_steps(run_ids, using), load_applied(run_ids, using)
    return Loaded(runs, steps, applied, load_timers(workflow_ids, using), None)


def _client_binding(cursor: Any) -> bool:
    """Whether this cursor takes several statements in one execute and returns each result set:
    psycopg 3's ClientCursor (OPTIONS server_side_binding off). Not a server-side-binding cursor
    (one statement per prepared query), not psycopg2 (its nextset() is not supported)."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - Django on psycopg2
        return False
    return isinstance(getattr(cursor, "cursor", None), psycopg.ClientCursor)


def _load_batched(cursor: Any, workflow_ids: list[str], connection: Any, using: str) -> Loaded:
    """The PostgreSQL load: five statements in one query string per chunk of ids. Steps and applied
    updates are keyed by the runs through a subquery on the same ids. Each statement reads its own
    snapshot (READ COMMITTED), as the separate queries did; rows of a run that began after the runs
    statement are dropped (the claim's epoch fences whatever the engine does with the older run)."""
    admitted: dict[str, list[AdmittedRow]] = {}
    loaded = Loaded({}, {}, {}, {}, admitted)
    table = Workflow._meta.db_table
    for chunk in _chunks(workflow_ids):
        marks = ", ".join(["%s"] * len(chunk))
        of_runs = f"SELECT run_id FROM {table} WHERE id IN ({marks})"
        statements = [_runs_sql(marks), _steps_sql(of_runs), _applied_sql(of_runs), _timers_sql(marks)]
        statements.append(_admitted_sql(marks))
        cursor.execute(";\n".join(statements), [*chunk * 5, UpdateStatus.ADMITTED.value])
        runs: dict[str, RunRow] = {}
        _decode_runs(cursor.fetchall(), connection, runs)
        loaded.runs.update(runs)
        steps: dict[str, dict[int, StepRecord]] = {row.run_id: {} for row in runs.values()}
        _next_result(cursor)
        _decode_steps(cursor.fetchall(), connection, steps)
        loaded.steps.update(steps)
        applied: dict[str, list[AppliedRecord]] = {}
        _next_result(cursor)
        _decode_applied(cursor.fetchall(), applied)
        loaded.applied.update((run_id, records) for run_id, records in applied.items() if run_id in steps)
        _next_result(cursor)
        _decode_timers(cursor.fetchall(), connection, using, loaded.timers)
        _next_result(cursor)
        _decode_admitted(cursor.fetchall(), admitted)
    return loaded


def _next_result(cursor: Any) -> None:
    if not cursor.nextset():
        raise DatabaseError("the load batch returned fewer result sets than it has statements")


def _read_chunked(
    using: str, keys: list[Any], build_sql: Callable[[str], str], decode: Callable[[list[Any]], None]
) -> None:
    """Run ``build_sql(placeholders)`` (one of the ``_*_sql`` builders above) for each chunk of ``keys``
    (no ORM compile) and hand its rows to ``decode``."""
    if not keys:
        return
    with connections[using].cursor() as cursor:
        for chunk in _chunks(keys):
            cursor.execute(build_sql(", ".join(["%s"] * len(chunk))), chunk)
            decode(cursor.fetchall())


def load_runs(workflow_ids: list[str], using: str) -> dict[str, RunRow]:
    """The current run of each of these workflows, by id."""
    rows: dict[str, RunRow] = {}
    _read_chunked(using, workflow_ids, _runs_sql, lambda values: _decode_runs(values, connections[using], rows))
    return rows


def load_steps(run_ids: list[str], using: str) -> dict[str, dict[int, StepRecord]]:
    """The step log of each of these runs: {run id: {seq: step}}."""
    steps: dict[str, dict[int, StepRecord]] = {run_id: {} for run_id in run_ids}
    connection = connections[using]
    _read_chunked(
        using, _run_keys(run_ids, connection), _steps_sql, lambda values: _decode_steps(values, connection, steps)
    )
    return steps


def load_applied(run_ids: list[str], using: str) -> dict[str, list[AppliedRecord]]:
    """The applied-update log of these runs, for replay: run id -> records in (seq, n) order."""
    applied: dict[str, list[AppliedRecord]] = {}
    keys = _run_keys(run_ids, connections[using])
    _read_chunked(using, keys, _applied_sql, lambda values: _decode_applied(values, applied))
    return applied


def load_timers(workflow_ids: list[str], using: str) -> dict[str, list[Timer]]:
    """The timers of these workflows (any run), by workflow id."""
    timers: dict[str, list[Timer]] = {}
    connection = connections[using]
    _read_chunked(using, workflow_ids, _timers_sql, lambda values: _decode_timers(values, connection, using, timers))
    return timers


def _run_keys(run_ids: list[str], connection: Any) -> list[Any]:
    field = Step._meta.get_field("run_id")  # every run_id column is a UUIDField: uuid or hex text
    return [field.get_db_prep_value(uuid.UUID(str(run_id)), connection) for run_id in run_ids]


def _aware(value: Any, connection: Any) -> datetime | None:
    """A datetime column as the ORM returns it: SQLite gives naive UTC datetimes (or text)."""
    if value is None or connection.vendor == "postgresql":
        return value
    converted: datetime = connection.ops.convert_datetimefield_value(value, None, connection)
    return converted


def _json_value(value: Any) -> Any:
    """A JSONField column as the ORM returns it (Django has psycopg return jsonb as text, like SQLite)."""
    return json.loads(value) if isinstance(value, str) else value


def _chunks(items: list[Any], size: int = 500) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def mailbox_of(leaf: Leaf) -> str:
    """The buffered-signal name a waiting leaf consumes: its signal, or its child's terminal record."""
    return mailbox_name(leaf.seq) if isinstance(leaf.op, StartChild) else leaf.op.name
