"""Observability hooks: one function per lifecycle event, called by one line where the event happens.

Each function bumps the Prometheus metrics (weft_django/metrics.py; no-ops without prometheus-client),
the per-engine counters behind ``weft_engine``'s status line, and sends the Django signal
(weft_django/signals.py) once the transaction that made the event durable has committed:
``transaction.on_commit`` defers it inside a transaction and runs it at once outside one. The signal
is built only when a receiver is connected (``has_listeners``), and ``send_robust`` keeps a raising
receiver from reaching the engine. Nothing here may raise into its caller.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django.db import transaction
from django.dispatch import Signal

from . import metrics, signals
from .store.claims import previous_holding
from .store.clock import db_clock

if TYPE_CHECKING:
    from .models import Workflow
    from .store.children import ChildStart
    from .store.commit import FenceResult, WorkflowWrites

logger = logging.getLogger(__name__)


# What the hooks read of the engine's objects (the engine calls them; they never import it).
class _Held(Protocol):
    """A workflow an engine holds (engine/owned.py's Owned)."""

    @property
    def workflow_id(self) -> str: ...

    @property
    def run_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _Attempt(Protocol):
    """An activity attempt (engine/activities.py's AttemptTask)."""

    @property
    def definition(self) -> _Named: ...


class _Outcome(Protocol):
    """An attempt's outcome (engine/activities.py's AttemptOutcome)."""

    @property
    def ok(self) -> bool: ...

    @property
    def refused(self) -> bool: ...


AttemptT = TypeVar("AttemptT", bound=_Attempt)
OutcomeT = TypeVar("OutcomeT", bound=_Outcome)
# Runs that ended badly, as operators read them at -v 1 (WARNING). An engine logger name, as docs/operations.md says.
run_logger = logging.getLogger("weft_django.engine.workflows")


@dataclasses.dataclass
class EngineStats:
    """Cumulative counts for one engine id; the status line prints differences between two reads."""

    steps_committed: int = 0
    steps_failed: int = 0
    workflows_finished: int = 0
    workflows_failed: int = 0
    claims_acquired: int = 0
    claims_taken_over: int = 0
    claims_lost: int = 0
    commits_refused: int = 0
    renewal_failures: int = 0

    def snapshot(self) -> EngineStats:
        return dataclasses.replace(self)


_stats: dict[str, EngineStats] = {}


def stats(engine_id: str) -> EngineStats:
    found = _stats.get(engine_id)
    if found is None:
        found = _stats[engine_id] = EngineStats()
    return found


def _models() -> tuple[type, type, type]:
    from .models import Step, Workflow, WorkflowClaim

    return Workflow, WorkflowClaim, Step


def _send(signal: Signal, sender: type, using: str, build: Callable[[], dict[str, Any]]) -> None:
    """Send ``signal`` after the current transaction on ``using`` commits (now, outside one)."""
    if not signal.has_listeners(sender):
        return
    try:
        kwargs = build()

        def fire() -> None:
            try:
                signal.send_robust(sender, using=using, **kwargs)
            except Exception:  # send_robust itself failed (e.g. an async receiver in a running loop)
                logger.exception("weft signal could not be sent signal=%s", _name(signal))

        transaction.on_commit(fire, using=using)
    except Exception:
        logger.exception("weft signal could not be scheduled signal=%s", _name(signal))


def _name(signal: Signal) -> str:
    return next((name for name in signals.__all__ if getattr(signals, name) is signal), "?")


def _guard(fn: Callable[..., None]) -> Callable[..., None]:
    """Observability must never break the engine: log and swallow whatever a hook raises."""

    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:
            logger.exception("observability hook failed hook=%s", fn.__name__)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


# -- starts -------------------------------------------------------------------------------------------
_RUN_FIELDS = ("id", "run_id", "workflow_type", "version", "status", "parent_id", "schedule_id")


def _started_kwargs(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "workflow_id": row["id"],
        "run_id": str(row["run_id"]),
        "workflow_type": row["workflow_type"],
        "version": row["version"],
        "status": str(row["status"]),
        "parent_id": row["parent_id"],
        "schedule_id": row["schedule_id"],
    }


@_guard
def workflow_started(run: Workflow | str, using: str) -> None:
    """A run was inserted (client start, start_new over a finished run, a schedule's occurrence), in
    the caller's transaction. ``run``: the saved row, or its id (then it is read back, in the same
    transaction, only when a receiver is connected). Counted in the metrics once it commits."""
    transaction.on_commit(metrics.workflow_started, using=using)
    workflow_model = _models()[0]

    def build() -> dict[str, Any]:
        if isinstance(run, str):
            row = workflow_model.objects.using(using).filter(pk=run).values(*_RUN_FIELDS).first()  # type: ignore[attr-defined]
            if row is None:
                raise LookupError(f"workflow {run!r} vanished before its start was reported")
            return _started_kwargs(row)
        return _started_kwargs({field: getattr(run, field) for field in _RUN_FIELDS})

    _send(signals.workflow_started, workflow_model, using, build)


def started_if(inserted: bool, workflow_id: str, using: str) -> bool:
    """For a start statement that reports whether it inserted: observe it if so; returns ``inserted``."""
    if inserted:
        workflow_started(workflow_id, using)
    return inserted


@_guard
def child_started(child: ChildStart, using: str) -> None:
    """A child run was inserted inside its parent's fenced commit (counted and signalled once that commits)."""
    transaction.on_commit(metrics.workflow_started, using=using)
    _send(
        signals.workflow_started,
        _models()[0],
        using,
        lambda: {
            "workflow_id": child.child_id,
            "run_id": child.run_id,
            "workflow_type": child.workflow_type,
            "version": child.version,
            "status": "running",
            "parent_id": child.parent_id,
            "schedule_id": None,
        },
    )


# -- the engine's fenced commits ------------------------------------------------------------------------
_FINISH_SIGNALS = {
    "completed": signals.workflow_completed,
    "failed": signals.workflow_failed,
    "cancelled": signals.workflow_cancelled,
    "timed_out": signals.workflow_timed_out,
}


@_guard
def committed(engine: Any, batch: Iterable[WorkflowWrites], result: FenceResult) -> None:
    """After ``fenced_commit`` returned (its transaction is over): what it made durable."""
    metrics.track_engine(engine)
    counts = stats(engine.engine_id)
    workflow_model, _, step_model = _models()
    for writes in batch:
        if writes.workflow_id not in result.committed:
            continue
        for step in writes.steps:
            if step.status not in ("completed", "failed"):
                continue  # an attempt being dispatched, not a settlement
            counts.steps_committed += 1
            if step.status == "failed":
                counts.steps_failed += 1
            metrics.step_settled(step.kind, step.status, _seconds(step.started_at, step.completed_at))
            if step.kind == "activity" and step.status == "failed":
                _send(
                    signals.activity_failed,
                    step_model,
                    engine.using,
                    _activity_failed_kwargs(engine.engine_id, writes, step),
                )
        if writes.finish is not None or writes.stuck is not None:
            metrics.claims("released")
        if writes.finish is not None:
            counts.workflows_finished += 1
            if writes.finish.status == "failed":
                counts.workflows_failed += 1
                _log_failed(engine, writes)
            metrics.workflow_finished(writes.finish.status)
            signal = _FINISH_SIGNALS.get(writes.finish.status)
            if signal is not None:
                _send(signal, workflow_model, engine.using, _finish_kwargs(engine, writes))
    for reason in result.lost.values():
        counts.commits_refused += 1
        metrics.commit_refused(reason)
    for _ in result.stale:  # a step its context believed running was settled by an atomic attempt
        counts.commits_refused += 1
        metrics.commit_refused("atomic")


def _log_failed(engine: Any, writes: WorkflowWrites) -> None:
    owned = engine.owned.get(writes.workflow_id)
    workflow_type = owned.run.ctx.workflow_type if owned is not None else None
    error = writes.finish.error if writes.finish is not None and isinstance(writes.finish.error, dict) else {}
    run_logger.warning(
        "workflow failed workflow=%s type=%s engine=%s epoch=%s error=%s: %s",
        writes.workflow_id,
        workflow_type,
        engine.engine_id,
        writes.epoch,
        error.get("type", "Error"),
        error.get("message", ""),
    )


def _activity_failed_kwargs(engine_id: str, writes: WorkflowWrites, step: Any) -> Callable[[], dict[str, Any]]:
    return lambda: {
        "engine_id": engine_id,
        "workflow_id": writes.workflow_id,
        "run_id": writes.run_id,
        "seq": step.seq,
        "activity": step.name,
        "attempts": step.attempts,
        "error": step.error,
    }


def _finish_kwargs(engine: Any, writes: WorkflowWrites) -> Callable[[], dict[str, Any]]:
    owned = engine.owned.get(writes.workflow_id)
    workflow_type = owned.run.ctx.workflow_type if owned is not None else None
    finish = writes.finish

    def build() -> dict[str, Any]:
        assert finish is not None
        kwargs: dict[str, Any] = {
            "workflow_id": writes.workflow_id,
            "run_id": writes.run_id,
            "workflow_type": workflow_type,
            "engine_id": engine.engine_id,
            "epoch": writes.epoch,
        }
        if finish.status == "completed":
            kwargs["result"] = _decoded(finish.result)
        elif finish.status == "failed":
            kwargs["error"] = finish.error
        else:
            kwargs["reason"] = (finish.error or {}).get("message")
        return kwargs

    return build


def _decoded(text: str | None) -> Any:
    from .codec import decode

    return decode(text)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    if end is None:
        return None
    return (end - start).total_seconds()


# -- transitions from any process -------------------------------------------------------------------------
@_guard
def workflow_ended(row: Mapping[str, Any], status: str, reason: str | None, using: str) -> None:
    """transitions._end_run, inside its transaction: cancelled or timed_out from outside the engine
    (counted and signalled once that commits: a caller's transaction may still roll it back)."""
    transaction.on_commit(functools.partial(metrics.workflow_finished, status), using=using)
    signal = _FINISH_SIGNALS.get(status)
    if signal is None:
        return
    _send(
        signal,
        _models()[0],
        using,
        lambda: {
            "workflow_id": row["id"],
            "run_id": str(row.get("run_id")) if row.get("run_id") is not None else None,
            "workflow_type": row.get("workflow_type"),
            "reason": reason,
            "engine_id": None,
            "epoch": None,
        },
    )


# -- claims ----------------------------------------------------------------------------------------------
@_guard
def claims_left_by_previous_process(engine: Any, grace: timedelta) -> None:
    """At start-up: claims still held under this engine's id by a process that died without releasing
    them (``kill -9``, then a restart with the same ``--engine-id``). Nothing can tell that process from a
    live one, so the claims are taken over like any other, once they expired plus the grace; say so, and
    when, instead of waiting silently. ``grace``: how long after expiry a claim may be taken over."""
    count, latest = previous_holding(engine.engine_id, engine.using)
    if not count or latest is None:
        return
    takeover_at = latest + grace
    wait = max((takeover_at - db_clock(engine.using)).total_seconds(), 0.0)
    logger.warning(
        "claims held by a previous process engine=%s claims=%s expires_at=%s takeover_at=%s wait=%.0fs: a process "
        "with this engine id stopped without releasing them (kill -9?); they are taken over once they expired plus "
        "the grace (%ss), like any other engine's",
        engine.engine_id,
        count,
        latest.isoformat(),
        takeover_at.isoformat(),
        wait,
        grace.total_seconds(),
    )


@_guard
def claims_acquired(engine_id: str, got: Mapping[str, Any], using: str) -> None:
    """Unheld claims taken (``got``: {workflow id: epoch or (epoch, previous holder)}), committed."""
    if not got:
        return
    stats(engine_id).claims_acquired += len(got)
    metrics.claims("acquired", len(got))
    claim_model = _models()[1]
    if not signals.claim_acquired.has_listeners(claim_model):
        return
    for wid, value in got.items():
        epoch = value[0] if isinstance(value, tuple) else value
        _send(signals.claim_acquired, claim_model, using, _claim_kwargs(engine_id, wid, epoch))


def claims_acquired_heard() -> bool:
    """Whether a ``claim_acquired`` receiver is connected: the acquire that sends it must then be
    durable first (its commit waits for the WAL flush; docs/decisions/0015)."""
    return bool(signals.claim_acquired.has_listeners(_models()[1]))


def _claim_kwargs(engine_id: str, workflow_id: str, epoch: int) -> Callable[[], dict[str, Any]]:
    return lambda: {"engine_id": engine_id, "workflow_id": workflow_id, "epoch": epoch}


@_guard
def claim_taken_over(engine: Any, workflow_id: str, epoch: int, previous: str | None) -> None:
    stats(engine.engine_id).claims_taken_over += 1
    metrics.claims("takeover")
    _send(
        signals.claim_taken_over,
        _models()[1],
        engine.using,
        lambda: {
            "engine_id": engine.engine_id,
            "workflow_id": workflow_id,
            "epoch": epoch,
            "previous_engine_id": previous,
        },
    )


def _loss_reason(reason: str) -> str:
    if reason == "cancelled":
        return "cancelled"
    if "refused" in reason:
        return "lost_race"
    if "store lease" in reason:
        return "store_lease_lost"
    return "deposed"


@_guard
def claim_lost(engine: Any, owned: _Held, reason: str | None) -> None:
    """The engine stops driving a run it held (Engine._drop). ``reason`` None: a reload after a
    database error, not a loss."""
    if reason is None:
        return
    kind = _loss_reason(reason)
    stats(engine.engine_id).claims_lost += 1
    metrics.claims("lost_race" if kind == "lost_race" else "deposed")
    _send(
        signals.claim_lost,
        _models()[1],
        engine.using,
        lambda: {
            "engine_id": engine.engine_id,
            "workflow_id": owned.workflow_id,
            "run_id": owned.run_id,
            "epoch": owned.epoch,
            "reason": kind,
        },
    )


@_guard
def claims_released(engine: Any, count: int) -> None:
    """Claims released at shutdown."""
    metrics.claims("released", count)


@_guard
def renewal_failed(engine: Any, error: BaseException) -> None:
    stats(engine.engine_id).renewal_failures += 1
    metrics.renewal_failed()


# -- activity attempts -----------------------------------------------------------------------------------
def timed_attempt(attempt: Callable[[AttemptT], OutcomeT], task: AttemptT) -> OutcomeT:
    """Run one attempt (ThreadExecutor._attempt) and record its duration."""
    began = time.monotonic()
    outcome = attempt(task)
    try:
        label = "ok" if outcome.ok else ("refused" if outcome.refused else "error")
        metrics.activity_attempt(task.definition.name, label, time.monotonic() - began)
        if outcome.refused:  # an atomic activity found its claim gone at commit time
            metrics.commit_refused("atomic")
    except Exception:
        logger.exception("observability hook failed hook=timed_attempt")
    return outcome
