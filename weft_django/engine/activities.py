"""Runs activity attempts on a thread pool and reports their outcomes to the engine loop.

An attempt is identified by (run, seq, attempt, epoch): the engine drops any outcome that does not
match what it currently waits for, so a timed-out or deposed attempt's late result is never recorded.
``atomic=True`` activities run inside transaction.atomic() and write their step in that same
transaction, after locking the claim row: the user's writes commit once, under the current epoch, or
not at all.

Every executor offers the same small interface (``Executor``): ``submit`` an attempt, report its outcome
on the shared ``outcomes`` queue, list what is ``running``, ``poll`` for outcomes that arrive through
the database (remote workers; a no-op here), ``shutdown``. engine/executors.py picks one per attempt.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from django.db import close_old_connections, transaction

from .. import events, tracing
from ..activity_runtime import ActivityInfo, AttemptControl, bind, propagates
from ..codec import decode, encode_payload
from ..exceptions import ActivityTimeoutError, CorruptPayloadError
from ..registry import ActivityDefinition
from ..store import runs
from ..store.claims import lock_claims
from ..store.clock import db_now
from .driver import describe_exception

logger = logging.getLogger(__name__)


class FenceRefused(Exception):
    """The claim was gone when an atomic activity tried to commit: roll the user's writes back."""


@dataclasses.dataclass
class AttemptTask:
    workflow_id: str
    run_id: str
    seq: int
    attempt: int
    epoch: int
    definition: ActivityDefinition
    args_text: str
    started_at: datetime
    # time.monotonic() after which the attempt has timed out. The timeout is the attempt's own run
    # time: the thread pool clears it while the attempt waits for a free thread and sets it when a
    # thread starts running it (start_clock). The engine loop reads it; a float store is atomic.
    deadline: float | None
    trace_context: str | None = None  # its run's (weft_django.tracing): the attempt's span is a child
    control: AttemptControl = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.control = AttemptControl(
            ActivityInfo(
                workflow_id=self.workflow_id,
                run_id=self.run_id,
                activity=self.definition.name,
                seq=self.seq,
                attempt=self.attempt,
                epoch=self.epoch,
                idempotency_key=f"{self.workflow_id}:{self.run_id}:{self.seq}",
            )
        )

    @property
    def key(self) -> tuple[str, int, int, int]:
        return (self.run_id, self.seq, self.attempt, self.epoch)

    def start_clock(self) -> None:
        """Start the per-attempt timeout now (the attempt starts running)."""
        timeout = self.definition.timeout
        self.deadline = time.monotonic() + timeout.total_seconds() if timeout is not None else None


@dataclasses.dataclass
class AttemptOutcome:
    task: AttemptTask
    ok: bool
    result: str | None = None
    error: dict[str, Any] | None = None
    retryable: bool = True
    committed: bool = False  # an atomic activity already wrote its step in its own transaction
    refused: bool = False  # an atomic activity found the claim gone: nothing was written
    # When a committed outcome's step was written (the database clock): the live step records the very
    # time replay reads back, so ctx.now() after it is the same live and on replay.
    completed_at: datetime | None = None


def commit_atomic_attempt(engine_id: str, using: str, task: AttemptTask, result: str) -> datetime:
    """Called inside an atomic activity's transaction, after the user's writes: lock the claim
    last (it still conflicts with a takeover), check that the step still waits for this very
    attempt, and write the step in the same transaction.

    Args:
        engine_id: the engine that holds the claim.
        using: the connection alias.
        task: the attempt.
        result: codec text of the activity's value.

    Returns:
        the step's completed_at as written (the database clock).

    Raises:
        FenceRefused: the claim is gone, or the step no longer waits for this attempt (the user's
            writes roll back).
    """
    if not lock_claims(engine_id, {task.workflow_id: task.epoch}, using):
        raise FenceRefused("claim")
    completed_at = db_now(using)
    if not runs.complete_attempt(task.run_id, task.seq, task.attempt, task.epoch, result, completed_at, using):
        raise FenceRefused("attempt")
    return completed_at


class Executor(Protocol):
    """What the engine needs from an activity executor."""

    outcomes: queue.SimpleQueue[AttemptOutcome]

    def submit(self, task: AttemptTask) -> None: ...

    @property
    def running(self) -> list[AttemptTask]: ...

    def poll(self, notified: set[str]) -> None: ...

    def shutdown(self, wait_seconds: float) -> None: ...


class ThreadExecutor:
    """The default ACTIVITY_EXECUTOR: a pool of threads in the engine process."""

    def __init__(
        self,
        concurrency: int,
        on_done: Callable[[], None],
        commit_atomic: Callable[[AttemptTask, str], datetime | None],
        using: str,
    ) -> None:
        # Plain worker threads on a SimpleQueue rather than a ThreadPoolExecutor: a hand-off is one
        # put(), with no Future, work item or pool bookkeeping per attempt (the loop's hot path).
        self._concurrency = concurrency
        self._queue: queue.SimpleQueue[AttemptTask | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._closed = False
        self.outcomes: queue.SimpleQueue[AttemptOutcome] = queue.SimpleQueue()
        self._on_done = on_done
        self._commit_atomic = commit_atomic
        self._using = using
        # By the task itself (its id(), the task kept alive here), not its key: after a reload at the same
        # epoch a stopped attempt still running and its new attempt share (run, seq, attempt, epoch).
        self._running: dict[int, AttemptTask] = {}
        self._lock = threading.Lock()

    def submit(self, task: AttemptTask) -> None:
        with self._lock:
            self._running[id(task)] = task
            # One more thread while every thread may be busy, up to the concurrency.
            if len(self._workers) < min(self._concurrency, len(self._running)):
                worker = threading.Thread(target=self._work, name=f"weft-activity_{len(self._workers)}", daemon=True)
                self._workers.append(worker)
                worker.start()
        # A queued attempt has no deadline: waiting for a free thread does not count against its
        # timeout (schedule_to_close_timeout, counted from the step's start, still covers it).
        task.deadline = None
        self._queue.put(task)

    def _work(self) -> None:
        while True:
            task = self._queue.get()
            if task is None or self._closed:
                return  # shut down: attempts still queued are not started (the next owner runs them)
            try:
                self._run(task)
            except BaseException:  # a SystemExit from user code must not kill the thread
                logger.exception("activity thread failed workflow=%s seq=%s", task.workflow_id, task.seq)

    @property
    def running(self) -> list[AttemptTask]:
        with self._lock:
            return list(self._running.values())

    @property
    def concurrency(self) -> int:
        """How many attempts run at once (threads)."""
        return self._concurrency

    @property
    def waiting(self) -> int:
        """Attempts handed over and not started yet: every thread is busy."""
        with self._lock:
            return max(0, len(self._running) - self._concurrency)

    def poll(self, notified: set[str]) -> None:
        """Outcomes arrive on the queue as threads finish: nothing to look up."""

    def _run(self, task: AttemptTask) -> None:
        if task.control.stop_reason is not None:
            # Stopped while queued (its workflow finished, was deposed or reloaded): the engine no
            # longer waits for it, so do not run the user's code at all.
            with self._lock:
                self._running.pop(id(task), None)
            self._on_done()
            return
        task.start_clock()
        close_old_connections()
        bind(task.control)
        try:
            with attempt_span(
                task.workflow_id,
                task.run_id,
                task.definition.name,
                task.seq,
                task.attempt,
                task.epoch,
                task.trace_context,
            ) as span:
                outcome = events.timed_attempt(self._attempt, task)
                if not outcome.ok:
                    tracing.set_attribute(span, "weft.outcome", "refused" if outcome.refused else "failed")
        finally:
            bind(None)
            close_old_connections()
            with self._lock:
                self._running.pop(id(task), None)
        self.outcomes.put(outcome)
        self._on_done()

    def _attempt(self, task: AttemptTask) -> AttemptOutcome:
        if task.definition.atomic:
            try:
                args, kwargs = arguments(task)
            except CorruptPayloadError as exc:
                return _undecodable(task, exc)
            try:
                return self._attempt_atomic(task, args, kwargs)
            except FenceRefused:
                return AttemptOutcome(task, ok=False, refused=True)
            except BaseException as exc:  # SystemExit too: a failed attempt, retried by its policy
                if propagates(exc):
                    raise
                return _failed(task, exc)
        return plain_attempt(task)

    def _attempt_atomic(self, task: AttemptTask, args: list[Any], kwargs: dict[str, Any]) -> AttemptOutcome:
        """The user's writes and the step commit together, under the claim, for this attempt only. The
        attempt's lock is held across COMMIT, so the engine cannot time the attempt out in between."""
        control = task.control
        atomic = transaction.atomic(using=self._using)
        atomic.__enter__()
        exited = False
        try:
            text = encode_payload(task.definition.fn(*args, **kwargs), path="activity result")
            with control.lock:
                if control.stop_reason is not None:
                    raise FenceRefused(control.stop_reason)
                if task.deadline is not None and time.monotonic() > task.deadline:
                    # Past its timeout: never commit, even if the engine loop has not noticed yet
                    # (on SQLite it may be waiting for the write lock this very transaction holds).
                    control.request_stop("the attempt timed out")
                    raise ActivityTimeoutError(
                        f"attempt {task.attempt} did not finish within {task.definition.timeout}"
                    )
                completed_at = self._commit_atomic(task, text)  # locks the claim last; raises FenceRefused
                exited = True
                atomic.__exit__(None, None, None)
                control.finished = True
        except BaseException as exc:
            if not exited:
                atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return AttemptOutcome(task, ok=True, result=text, committed=True, completed_at=completed_at)

    def shutdown(self, wait_seconds: float) -> None:
        deadline = time.monotonic() + wait_seconds
        while self.running and time.monotonic() < deadline:
            time.sleep(0.02)
        self._closed = True
        for _ in self._workers:
            self._queue.put(None)


def _failed(task: AttemptTask, exc: BaseException) -> AttemptOutcome:
    definition = task.definition
    logger.info(
        "activity failed workflow=%s activity=%s seq=%s attempt=%s epoch=%s error=%s",
        task.workflow_id,
        definition.name,
        task.seq,
        task.attempt,
        task.epoch,
        type(exc).__name__,
    )
    return AttemptOutcome(task, ok=False, error=describe_exception(exc), retryable=definition.retry.is_retryable(exc))


def arguments(task: AttemptTask) -> tuple[list[Any], dict[str, Any]]:
    """The attempt's (args, kwargs). Raises CorruptPayloadError when its text does not decode."""
    payload = decode(task.args_text) or {}
    return payload.get("args", []), payload.get("kwargs", {})


def _undecodable(task: AttemptTask, exc: CorruptPayloadError) -> AttemptOutcome:
    """The failed outcome of an attempt whose arguments do not decode: not retryable (every attempt
    reads the same text). Raised instead, it left the thread and its workflow waited for ever."""
    logger.warning("activity arguments undecodable workflow=%s seq=%s error=%s", task.workflow_id, task.seq, exc)
    return AttemptOutcome(task, ok=False, error=describe_exception(exc), retryable=False)


def plain_attempt(task: AttemptTask) -> AttemptOutcome:
    """Run a (non-atomic) attempt's function on this thread: its outcome. The function's exception is
    the outcome, any BaseException but those that ``activity_runtime.propagates`` (a SystemExit from
    user code is a failed attempt, as Django's task backends treat it; left to propagate, the engine
    would wait for an outcome that never comes); undecodable arguments fail it, not retryable."""
    try:
        args, kwargs = arguments(task)
    except CorruptPayloadError as exc:
        return _undecodable(task, exc)
    try:
        value = task.definition.fn(*args, **kwargs)
        return AttemptOutcome(task, ok=True, result=encode_payload(value, path="activity result"))
    except BaseException as exc:
        if propagates(exc):  # Ctrl+C (an engine runs no worker framework: theirs fail the attempt)
            raise
        return _failed(task, exc)


def run_local(task: AttemptTask) -> AttemptOutcome:
    """A local activity's attempt (``local=True``), run now on the calling thread (the engine loop's).

    Nothing was recorded before it: the caller records its step in the workflow's next fenced commit.
    Its ``timeout`` cannot interrupt it; an attempt that returns after its timeout counts as timed out
    (ActivityTimeoutError, retried by its policy like any attempt)."""
    task.start_clock()
    bind(task.control)
    try:
        span = attempt_span(
            task.workflow_id, task.run_id, task.definition.name, task.seq, task.attempt, task.epoch, task.trace_context
        )
        with span as opened:
            outcome = events.timed_attempt(plain_attempt, task)
            if not outcome.ok:
                tracing.set_attribute(opened, "weft.outcome", "failed")
    finally:
        bind(None)
    task.control.finished = True
    if task.deadline is not None and time.monotonic() > task.deadline:
        message = f"attempt {task.attempt} did not finish within {task.definition.timeout}"
        return _failed(task, ActivityTimeoutError(message))
    return outcome


def attempt_span(
    workflow_id: str,
    run_id: str,
    activity: str,
    seq: int,
    attempt: int,
    epoch: int,
    trace_context: str | None,
    *,
    worker: str | None = None,
) -> Any:
    """One activity attempt's span (``weft.activity.attempt``), a child of its run's trace context:
    on an engine thread, or (``worker``) on a Celery worker."""
    attributes = {
        "weft.workflow_id": workflow_id,
        "weft.run_id": run_id,
        "weft.activity": activity,
        "weft.seq": seq,
        "weft.attempt": attempt,
        "weft.epoch": epoch,
        "weft.worker": worker,
    }
    kind = "INTERNAL" if worker is None else "CONSUMER"
    return tracing.span("weft.activity.attempt", carrier=trace_context, kind=kind, attributes=attributes)
