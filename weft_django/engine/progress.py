"""The per-workflow state machine of the engine: arming the operations at a workflow's frontier
(activity attempts, timers, signal waits, children), settling them from activity outcomes, timer
fires and buffered signals, and turning each settlement into writes for the next fenced commit.

``Progress`` is a part the loop (engine/engine.py) owns: it holds the owned workflows and the timer
heap the loop shares with it, and asks the loop, through the callables it was given, to drop or
reload a workflow. What a step becomes is decided by the pure functions of engine/steps.py; this
module applies them to the live state. It reads no database itself: which buffered signals a parked
workflow consumes is engine/signal_delivery.py's part."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from .. import tracing
from ..codec import encode
from ..context import WorkflowContext
from ..exceptions import QueryNotFoundError, WorkflowNotLocallyOwnedError
from ..models import Timer
from ..operations import RunActivity, Sleep, StartChild, WaitForSignal, WaitForUpdate, WaitUntil
from ..registry import WorkflowDefinition
from ..status import StepStatus, TimerKind, WorkflowStatus
from ..store.children import ChildStart
from ..store.commit import Finish, WorkflowWrites
from ..store.histories import RunRow
from ..store.notify import BufferedRow
from ..store.writes import Continuation
from . import history_size, signal_delivery, steps
from .activities import AttemptOutcome, AttemptTask, run_local
from .attention import Attention
from .children import MAX_DEPTH
from .driver import AppliedRecord, StepRecord, WorkflowRun
from .owned import (
    Owned,
    collect_recorded,
    default_child_id,
    mailbox_of,
    mark_stuck,
    span_attributes,
    writes_of,
)
from .timers import TimerHeap
from .wake import Wake

logger = logging.getLogger("weft_django.engine.engine")
__all__ = [
    "Owned",
    "Progress",
    "collect_recorded",
    "mailbox_of",
    "mark_stuck",
    "writes_of",
]


class Progress:
    """The per-workflow state machine: one instance per engine, over the workflows it owns.

    Args:
        engine_id: the engine (for logs).
        using: the connection alias.
        owned: the owned workflows by id (the loop's dict: the loop adds and drops entries).
        timers: the loop's timer heap.
        wake: the loop's wake-ups (a signal or update wait asks for a mailbox look).
        on_refused: called for a workflow whose atomic activity's commit was refused (the loop
            reloads it from the durable log).
        attention: the loop's index of workflows with work no wake-up names (engine/attention.py):
            a new context, and attempts queued for dispatch, are added to it here.
    """

    def __init__(
        self,
        engine_id: str,
        using: str,
        owned: dict[str, Owned],
        timers: TimerHeap,
        wake: Wake,
        on_refused: Callable[[Owned], None],
        attention: Attention,
    ) -> None:
        self.engine_id = engine_id
        self.attention = attention
        self.using = using
        self.owned = owned
        self.timers = timers
        self.wake = wake
        self.on_refused = on_refused
        self.unsettled: set[str] = set()  # changed workflows a pass's cascade left to the next (cascade.py)
        self.parked: Mapping[str, int] = {}  # admitted updates unhandled where seen (messages.py's, the engine's)

    def processing(self) -> bool:
        """Whether an owned workflow has an attempt running, to dispatch, or waiting out its retry
        back-off (still being processed, not parked)."""
        return bool(self.unsettled) or any(
            o.inflight
            or o.dispatch
            or any(kind == TimerKind.ACTIVITY_RETRY and o.run.is_pending(seq) for kind, seq in o.timers)
            for o in self.owned.values()
        )

    def run_cancel_handlers(self, wid: str) -> None:
        """Run a cancelled workflow's on_cancel handlers once, in memory (its cancellation is durable)."""
        owned = self.owned.get(wid)
        if owned is None:
            return
        owned.run.ctx.cancelled = True
        for handler in owned.run.ctx.cancel_handlers:
            try:
                handler()
            except Exception:
                logger.exception("on_cancel handler failed workflow=%s engine=%s", wid, self.engine_id)

    def answer_query(self, workflow_id: str, name: str, *args: Any) -> Any:
        """Answer a query from the live context: the built-in ``activity_progress`` first (latest
        heartbeat details of the running activity), then a query handler, then an exposed accessor.

        Args:
            workflow_id: an owned workflow.
            name: the query's name.
            args: its arguments (the handler runs read-only: ``WorkflowContext.reading``).

        Raises:
            WorkflowNotLocallyOwnedError: this engine does not drive the workflow.
            QueryNotFoundError: the workflow has no such query.
        """
        owned = self.owned.get(workflow_id)
        if owned is None:
            message = f"Workflow {workflow_id!r} is not driven by engine {self.engine_id!r}; ask its holder."
            raise WorkflowNotLocallyOwnedError(message)
        if name == "activity_progress":
            running = sorted(owned.inflight.values(), key=lambda task: task.seq)
            return running[-1].control.details if running else None
        ctx = owned.run.ctx
        handler = ctx.query_handlers.get(name) or ctx.exposed.get(name)
        if handler is None:
            raise QueryNotFoundError(f"Workflow {workflow_id!r} has no query {name!r}; register it with ctx.on_query.")
        with ctx.reading("a query handler"):
            return handler(*args)

    # -- a freshly loaded workflow ---------------------------------------------------------------
    def adopt(
        self,
        row: RunRow,
        epoch: int,
        definition: WorkflowDefinition,
        history: dict[int, StepRecord],
        timers: list[Timer],
        applied: list[AppliedRecord] | None,
        writes: dict[str, WorkflowWrites],
    ) -> Owned:
        """Start driving a claimed run: replay its generator to the frontier, arm its loaded timers.

        Args:
            row: the run as loaded.
            epoch: the claim's epoch.
            definition: the registered workflow it runs.
            history: its step log by seq.
            timers: its durable timers.
            applied: the updates replay re-applies.
            writes: the pass's writes (a cleared stuck mark is written).
        """
        ctx = WorkflowContext(
            workflow_id=row.id,
            run_id=str(row.run_id),
            workflow_type=row.workflow_type,
            started_at=row.started_at,
            epoch=epoch,
        )
        ctx.attribute_kinds = definition.attributes  # ctx.set_attributes checks against them (issue 19)
        run = WorkflowRun(definition, ctx, row.input, history, applied, row.fork_origin)
        owned = Owned(
            row.id,
            str(row.run_id),
            epoch,
            run,
            stuck_attempts=row.stuck_attempts,
            parent=(row.parent_id, str(row.parent_run_id), row.parent_seq)
            if row.parent_id and row.parent_seq is not None
            else None,
            depth=row.depth,
            clear_stuck=row.stuck_error is not None,
            trace_context=row.trace_context,
            deadline=row.execution_deadline,
            continued=row.continued,
        )
        self.owned[row.id] = owned
        self.attention.unchecked.add(row.id)  # its mailbox has not been looked at yet
        for timer in timers:
            owned.timers[(timer.kind, timer.seq or 0)] = timer
            self.timers.push(timer.fire_at, row.id, timer.kind, timer.seq or 0)
        if row.execution_deadline is not None:
            self.timers.push(row.execution_deadline, row.id, TimerKind.EXECUTION_DEADLINE, -1)
        run.occupied = {t.seq: t.kind for t in timers if t.seq is not None and str(t.run_id) == owned.run_id}
        run.start()
        # A wait's step records when it really began.
        owned.armed_at.update(steps.wait_starts(run, owned.timers, row.started_at))
        if owned.clear_stuck:
            writes_of(owned, writes).clear_stuck = True
        return owned

    # -- effects of a generator's new frontier ------------------------------------------------------
    def advance(self, wid: str, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]) -> None:
        """Turn a workflow's new frontier into writes: its end, or the operations to arm (one
        ``weft.workflow.turn`` span)."""
        owned = self.owned.get(wid)
        if owned is None or self.wake.gone(wid, owned.epoch):  # lost meanwhile (a stuck pass: engine/stall.py)
            return
        if not tracing.enabled():  # the common case: no span, and no attributes built for it
            self._advance(owned, now, writes, changed)
            history_size.warn_if_long(owned)
            return
        with tracing.span("weft.workflow.turn", carrier=owned.trace_context, attributes=span_attributes(owned)) as span:
            self._advance(owned, now, writes, changed)
            tracing.set_attribute(span, "weft.finished", owned.run.finished)
        history_size.warn_if_long(owned)

    def _advance(self, owned: Owned, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]) -> None:
        wid = owned.workflow_id
        run = owned.run
        # Not before the last step fed to the code ended: a local step of this very pass ends after
        # the pass's clock reading, and what it arms next (a timeout, a sleep) counts from its end.
        now = max(now, run.clock) if run.clock is not None else now
        collect_recorded(owned, writes)
        if run.finished:
            w = writes_of(owned, writes)
            if run.stuck is not None:
                mark_stuck(self.engine_id, wid, owned.run_id, owned.epoch, owned.stuck_attempts, run.stuck, now, writes)
            elif run.continued is not None:
                w.continued = Continuation(str(uuid.uuid4()), run.continued.input_text, run.continued.version)
            elif run.completed:
                w.finish = Finish(WorkflowStatus.COMPLETED, result=run.result_text)
            else:
                w.finish = Finish(WorkflowStatus.FAILED, error=run.failure)
            for task in owned.inflight.values():
                task.control.request_stop("the workflow finished")
            return
        local: list[tuple[int, RunActivity]] = []
        signal_wait = False
        for leaf in run.pending_leaves():
            if leaf.seq in owned.armed:
                continue
            owned.armed.add(leaf.seq)
            owned.armed_at.setdefault(leaf.seq, now)
            op = leaf.op
            if isinstance(op, RunActivity) and op.activity.local and leaf.seq not in run.steps:
                local.append((leaf.seq, op))  # run below, once this frontier's other leaves are armed
            elif isinstance(op, RunActivity):
                self._arm_activity(owned, leaf.seq, op, now, writes)
            elif isinstance(op, Sleep):
                self._arm_timer(owned, TimerKind.SLEEP, leaf.seq, now + op.duration, writes)
            elif isinstance(op, WaitForSignal):
                if op.timeout is not None:
                    self._arm_timer(owned, TimerKind.SIGNAL_TIMEOUT, leaf.seq, now + op.timeout, writes)
                self.wake.look_for_signal(wid)  # look for a buffered signal on the next pass
                signal_wait = True
            elif isinstance(op, StartChild):
                self._arm_child(owned, leaf.seq, op, now, writes, changed)
            elif isinstance(op, WaitUntil):
                self._check_wait_until(owned, leaf.seq, op, now, writes, changed)
            elif isinstance(op, WaitForUpdate):
                self.wake.look_at(wid)  # look for an admitted update on the next pass
        for seq, op in local:  # one after the other: each begins when the one before it returned
            if run.is_pending(seq):
                now = self._run_local(owned, seq, op, now, writes, changed)
        # A backlog's next record, in this pass; not ahead of what the next pass would settle first: a
        # wake-up to note, an admitted update of a new context, looked at again or parked (deliver_known).
        if signal_wait and not (self.wake.unnoted(wid) or wid in self.attention.unchecked or wid in self.parked):
            signal_delivery.deliver_known(self, owned, now, writes, changed)

    def _run_local(
        self,
        owned: Owned,
        seq: int,
        op: RunActivity,
        now: datetime,
        writes: dict[str, WorkflowWrites],
        changed: set[str],
    ) -> datetime:
        """A local activity: run it now, on this thread, with no attempt record; its step joins the pass's writes
        (durable with the workflow's next commit). A failed attempt with a retry due: the step is recorded as running,
        its retries dispatched as any activity's. Returns when it ended (``now`` plus the time it ran)."""
        task = self._task(owned, seq, op, 1, now)
        began = time.monotonic()
        outcome = run_local(task)
        now += timedelta(seconds=time.monotonic() - began)  # when it ended, in workflow time
        if outcome.ok:
            self.settle(owned, steps.activity_completed(task, outcome.result, now), writes, changed)
            return now
        if steps.retry_at(task, outcome.retryable, now) is not None:
            step = StepRecord(seq, "activity", op.name, StepStatus.RUNNING, attempts=1, started_at=task.started_at)
            owned.run.record(step)
            writes_of(owned, writes).steps.append(step)
        self._on_failure(owned, task, outcome.error or {}, outcome.retryable, now, writes, changed)
        return now

    def _arm_activity(
        self, owned: Owned, seq: int, op: RunActivity, now: datetime, writes: dict[str, WorkflowWrites]
    ) -> None:
        step = owned.run.steps.get(seq)
        if step is None:
            step = StepRecord(seq, "activity", op.name, StepStatus.RUNNING, attempts=1, started_at=now)
            owned.run.record(step)
            writes_of(owned, writes).steps.append(step)
        elif (TimerKind.ACTIVITY_RETRY, seq) in owned.timers:
            timer = owned.timers[(TimerKind.ACTIVITY_RETRY, seq)]
            self.timers.push(timer.fire_at, owned.workflow_id, TimerKind.ACTIVITY_RETRY, seq)
            return
        # A recovered attempt runs again under the same attempt number.
        self.attention.queue(owned, self._task(owned, seq, op, step.attempts, step.started_at or now))

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
        self.wake.look_for_signal(owned.workflow_id, wake=False)  # its record may be waiting already
        if owned.run.steps.get(seq) is not None:
            return
        child_id = op.child_id or default_child_id(owned, seq)
        step = StepRecord(seq, "child", op.name, StepStatus.RUNNING, encode(child_id), attempts=1, started_at=now)
        owned.run.record(step)
        w = writes_of(owned, writes)
        w.steps.append(step)
        if owned.depth + 1 > MAX_DEPTH:
            self.settle(owned, steps.child_too_deep(step, child_id, owned.depth + 1, MAX_DEPTH, now), writes, changed)
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
                trace_context=owned.trace_context,
                queue=op.queue,
                priority=op.priority,
                concurrency_key=op.concurrency_key,
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
            trace_context=owned.trace_context,
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
        writes_of(owned, writes).timers_add.append(timer)
        self.timers.push(fire_at, owned.workflow_id, kind, seq)

    def take_timer(self, owned: Owned, kind: str, seq: int, writes: dict[str, WorkflowWrites]) -> Timer | None:
        """Disarm ``owned``'s timer (kind, seq), its row deleted (or not written) by the next commit."""
        timer = owned.timers.pop((kind, seq), None)
        if timer is not None:
            w = writes_of(owned, writes)
            if timer.pk is not None:
                w.timers_delete.append(timer.pk)
            elif timer in w.timers_add:
                w.timers_add.remove(timer)
        return timer

    def settle(self, owned: Owned, step: StepRecord, writes: dict[str, WorkflowWrites], changed: set[str]) -> None:
        """Record ``step`` as settled in ``owned``'s history and writes, and have the cascade advance it."""
        began = owned.armed_at.pop(step.seq, None)
        if step.started_at is None and began is not None:
            step.started_at = began  # a wait's step spans from when it began (the admin's timeline)
        owned.run.record(step)
        writes_of(owned, writes).steps.append(step)
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
        if steps.holds(op, owned.workflow_id):
            self.take_timer(owned, TimerKind.WAIT_CONDITION, seq, writes)
            self.settle(owned, steps.wait_satisfied(seq, now), writes, changed)
        elif op.timeout is not None:
            self._arm_timer(owned, TimerKind.WAIT_CONDITION, seq, now + op.timeout, writes)

    def recheck_wait_until(
        self, owned: Owned, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]
    ) -> None:
        """After an update handler ran: settle the armed wait_until leaves whose predicate holds now.
        (Signals do not re-drive a wait_until, as in weft; its timeout timer stays armed otherwise.)"""
        for leaf in owned.run.pending_leaves():
            if not isinstance(leaf.op, WaitUntil) or leaf.seq not in owned.armed:
                continue
            if steps.holds(leaf.op, owned.workflow_id):
                self.take_timer(owned, TimerKind.WAIT_CONDITION, leaf.seq, writes)
                self.settle(owned, steps.wait_satisfied(leaf.seq, now), writes, changed)

    # -- activity outcomes ---------------------------------------------------------------------------
    def on_outcome(
        self, outcome: AttemptOutcome, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]
    ) -> None:
        """Settle the step of a finished attempt (or arm its retry), if it is the very attempt the
        workflow waits for; a late or stale outcome is discarded."""
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
            # Reloaded from the durable log at the same epoch (if the claim is not ours any more, the
            # next fenced commit says so), not left to wait for its own claim to expire.
            self.on_refused(owned)
            return
        if outcome.ok:
            previous = owned.run.steps.get(task.seq)
            error = previous.error if previous is not None and previous.status == StepStatus.RUNNING else None
            step = steps.activity_completed(task, outcome.result, outcome.completed_at or now, error)
            if outcome.committed:
                owned.run.record(step)
                owned.armed.discard(task.seq)
                owned.run.settle(task.seq, step.outcome)
                changed.add(owned.workflow_id)
            else:
                self.settle(owned, step, writes, changed)
            return
        self._on_failure(owned, task, outcome.error or {}, outcome.retryable, now, writes, changed)

    def _on_failure(
        self,
        owned: Owned,
        task: AttemptTask,
        error: dict[str, object],
        retryable: bool,
        now: datetime,
        writes: dict[str, WorkflowWrites],
        changed: set[str],
    ) -> None:
        if task.definition.atomic:  # an older context's attempt may have committed the step meanwhile
            writes_of(owned, writes).guards[task.seq] = task.attempt
        fire_at = steps.retry_at(task, retryable, now)
        if fire_at is not None:
            step = owned.run.steps.get(task.seq)
            if step is not None and step.status == StepStatus.RUNNING:  # the failed attempt's error, kept
                steps.retried(step, task, error)
                writes_of(owned, writes).steps.append(step)
            self._arm_timer(owned, TimerKind.ACTIVITY_RETRY, task.seq, fire_at, writes, attempt=task.attempt + 1)
            return
        self.settle(owned, steps.activity_failed(task, error, now), writes, changed)

    def expire_attempts(self, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]) -> None:
        """Fail (or retry) the attempts past their timeout that are not committing right now."""
        clock = time.monotonic()
        for owned in self.attention.in_flight(self.owned):  # not every parked one, every pass
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
                error, retryable = steps.timed_out(task)
                self._on_failure(owned, task, error, retryable, now, writes, changed)

    # -- timers and signals ----------------------------------------------------------------------
    def on_timer(
        self,
        wid: str,
        kind: str,
        seq: int,
        fire_at: datetime,
        now: datetime,
        writes: dict[str, WorkflowWrites],
        changed: set[str],
    ) -> None:
        """A due timer of an owned workflow fired: settle what it ends. A stale fire is ignored: its ``fire_at`` is
        no longer its timer's or deadline's (an earlier run's entry under the same id, or a disarmed timer's)."""
        owned = self.owned.get(wid)
        if owned is None:
            return
        if kind == TimerKind.EXECUTION_DEADLINE:
            if fire_at != owned.deadline or (owned.run.finished and owned.run.stuck is None):
                return  # an earlier run's deadline; or this run ended (or continued) first, and that stands
            writes_of(owned, writes).finish = Finish(
                WorkflowStatus.TIMED_OUT,
                error={"type": "WorkflowTimedOutError", "message": "The run passed its execution timeout."},
            )
            for task in owned.inflight.values():  # as at any other end: its attempts are asked to stop
                task.control.request_stop("the run passed its execution timeout")
            owned.run.close()
            return
        if (kind, seq) not in owned.timers or owned.timers[(kind, seq)].fire_at != fire_at:
            return
        if not owned.run.is_pending(seq):
            if kind == TimerKind.ACTIVITY_RETRY:  # a retry of a step not waiting for one (an odd row): gone
                self.take_timer(owned, kind, seq, writes)
            return
        timer = self.take_timer(owned, kind, seq, writes)
        if kind == TimerKind.ACTIVITY_RETRY:
            if timer is not None:
                waiting = owned.run.pending_leaf(seq)
                assert waiting is not None  # is_pending(seq) above
                leaf_op = waiting.op
                assert isinstance(leaf_op, RunActivity)
                step = owned.run.steps[seq]
                believed, step.attempts = step.attempts, timer.attempt or step.attempts + 1
                steps.dispatched(step, now)
                pending = writes_of(owned, writes)
                pending.steps.append(step)  # the attempt count is durable before dispatch
                task = self._task(owned, seq, leaf_op, step.attempts, step.started_at or now)
                if task.definition.atomic:  # an older context's attempt may have committed it meanwhile
                    pending.guards[seq] = believed
                self.attention.queue(owned, task)
            return
        leaf = owned.run.pending_leaf(seq)
        fired = steps.timer_fired(kind, seq, leaf, now, wid)
        if fired is not None:
            self.settle(owned, fired, writes, changed)

    def deliverable(self) -> bool:
        """Whether a buffered signal (or child-terminal record) waits for a workflow parked here."""
        return signal_delivery.deliverable(self.owned, self.using)

    def deliver_signals(
        self,
        workflow_ids: set[str],
        carried: Mapping[str, list[BufferedRow]],
        must_read: set[str],
        now: datetime,
        writes: dict[str, WorkflowWrites],
        changed: set[str],
    ) -> bool:
        """Consume the buffered signals these workflows wait for (engine/signal_delivery.py)."""
        return signal_delivery.deliver(self, workflow_ids, carried, must_read, now, writes, changed)
