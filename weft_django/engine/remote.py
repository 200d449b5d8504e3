"""Activity attempts that run outside the engine process (Celery workers) and report through the
database. No Celery here: contrib/celery.py carries the messages, this module holds the rules.

An attempt is keyed by (run, seq, attempt, epoch). A worker is not an engine and holds no claim, so
it commits like an atomic activity's step: one transaction (``store.commit.fenced``) that first locks
the claim row at the attempt's epoch, and only while some engine holds it there (``FOR NO KEY
UPDATE``, the lock every fenced commit, takeover and transition takes; on SQLite the IMMEDIATE
transaction holds the write lock). Then it checks that the step still waits for exactly this attempt
(the Step is running at that attempt number and no failure or expiry is recorded for it) and writes

- a result: the Step itself (completed, at the attempt's epoch); the step's RemoteAttempt rows go;
- an error: the attempt's RemoteAttempt row becomes ``failed`` with the error and the exception's class
  names; the owner turns it into a retry or an ActivityError under its own retry policy,

and sends ``w:<workflow id>``. Anything else is refused and logged, never recorded: a stale epoch (the
workflow was taken over, cancelled, suspended, retried, or released by its engine), a duplicate
delivery (the step moved on, or this attempt already failed), an attempt its owner timed out.

A result from an old epoch is refused even when the step still waits for the same attempt number: the
new owner has sent that attempt again under its own epoch and waits for that one (and an atomic
activity's writes must commit under the current epoch). The owner times an attempt out the same way
(``expire``): it locks its claim and, unless the worker's result is already in, marks the attempt
``expired`` in that transaction, so exactly one of the two wins.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import operator
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from django.db import DatabaseError, connections, transaction
from django.db.models import Q

from .. import tracing
from ..activity_runtime import ActivityInfo, AttemptControl, bind, propagates
from ..codec import decode, encode, encode_payload
from ..conf import database_alias, payload_max_bytes
from ..exceptions import ActivityCancelledError
from ..models import RemoteAttempt, RemoteAttemptState, Step
from ..registry import registry
from ..status import StepStatus
from ..store import claims
from ..store.backend import backend
from ..store.clock import db_clock, db_now
from ..store.commit import fenced
from ..store.moments import readable
from ..store.notify import send
from .activities import attempt_span
from .driver import describe_exception
from .worker_errors import exception_types, recorded_types

logger = logging.getLogger(__name__)
HEARTBEAT_INTERVAL = 1.0  # seconds: a worker writes heartbeat details at most this often
COMMIT_ATTEMPTS = 5  # a worker retries an outcome's commit this often after a database error
CHUNK = 200


class AttemptKey(NamedTuple):
    workflow_id: str
    run_id: str
    seq: int
    attempt: int
    epoch: int

    @property
    def ident(self) -> tuple[str, int, int, int]:
        return (self.run_id, self.seq, self.attempt, self.epoch)


class Disposition(enum.StrEnum):
    RECORDED = "recorded"
    ALREADY_RECORDED = "already recorded"  # a duplicate delivery, or a commit retried after an unknown outcome
    STALE_EPOCH = "stale epoch"
    NOT_WAITING = "not waiting"  # the step moved on, or this attempt already failed or timed out


@dataclasses.dataclass(frozen=True)
class RemoteOutcome:
    ok: bool
    result: str | None = None
    error: dict[str, Any] | None = None
    error_types: tuple[str, ...] = ()
    # The attempt was timed out (its row is ``expired``): by an earlier context of the workflow at the
    # same epoch, reloaded before the timeout's retry committed. It can never finish: time it out now.
    expired: bool = False
    # A result's: its step's completed_at as the worker wrote it (ctx.now() reads it); metadata, not
    # part of what the outcome is, so two outcomes compare equal whatever time they carry.
    completed_at: datetime | None = dataclasses.field(default=None, compare=False)


# -- the worker's side ------------------------------------------------------------------------------
def _attempt_rows(key: AttemptKey, using: str) -> Any:
    return RemoteAttempt.objects.using(using).filter(
        run_id=key.run_id, seq=key.seq, attempt=key.attempt, epoch=key.epoch
    )


def _refused(key: AttemptKey, what: str, disposition: Disposition, reason: str) -> Disposition:
    log = logger.info if disposition is Disposition.ALREADY_RECORDED else logger.warning
    log(
        "remote %s refused workflow=%s seq=%s attempt=%s epoch=%s disposition=%s reason=%s",
        what,
        key.workflow_id,
        key.seq,
        key.attempt,
        key.epoch,
        disposition,
        reason,
    )
    return disposition


def complete(key: AttemptKey, result: str, using: str) -> Disposition:
    """Record the attempt's result in its Step, fenced by the claim at its epoch. Safe to retry."""
    with fenced([key.workflow_id], using, holder=(None, {key.workflow_id: key.epoch})) as fence:
        if not fence.held:
            return _refused(key, "result", Disposition.STALE_EPOCH, why_stale(key, using) or "the epoch moved on")
        state = _attempt_rows(key, using).values_list("state", flat=True).first()
        if state in (RemoteAttemptState.FAILED, RemoteAttemptState.EXPIRED):
            return _refused(key, "result", Disposition.NOT_WAITING, f"this attempt is already {state}")
        # error is left as it is: a step that succeeded on a retry keeps the last failed attempt's.
        written = (
            Step.objects.using(using)
            .filter(run_id=key.run_id, seq=key.seq, status=StepStatus.RUNNING, attempts=key.attempt)
            .update(status=StepStatus.COMPLETED, result=result, epoch=key.epoch, completed_at=db_now(using))
        )
        if written != 1:
            recorded = (
                Step.objects.using(using)
                .filter(
                    run_id=key.run_id, seq=key.seq, status=StepStatus.COMPLETED, attempts=key.attempt, epoch=key.epoch
                )
                .exists()
            )
            if recorded:
                return _refused(key, "result", Disposition.ALREADY_RECORDED, "this attempt's result is already in")
            return _refused(key, "result", Disposition.NOT_WAITING, "the step no longer waits for this attempt")
        RemoteAttempt.objects.using(using).filter(run_id=key.run_id, seq=key.seq).delete()
        send("w", key.workflow_id, using)
    return Disposition.RECORDED


def fail(
    key: AttemptKey, activity: str, error: dict[str, Any], types: list[str], worker: str, using: str
) -> Disposition:
    """Record that the attempt raised, fenced like ``complete``: its owner decides retry or ActivityError."""
    with fenced([key.workflow_id], using, holder=(None, {key.workflow_id: key.epoch})) as fence:
        if not fence.held:
            return _refused(key, "failure", Disposition.STALE_EPOCH, why_stale(key, using) or "the epoch moved on")
        step = Step.objects.using(using).filter(run_id=key.run_id, seq=key.seq).values_list("status", "attempts")
        if step.first() != (StepStatus.RUNNING, key.attempt):
            return _refused(key, "failure", Disposition.NOT_WAITING, "the step no longer waits for this attempt")
        _ensure_row(key, activity, "", using)
        written = (
            _attempt_rows(key, using)
            .filter(state=RemoteAttemptState.SENT)
            .update(
                state=RemoteAttemptState.FAILED,
                error=error,
                error_types=types,
                worker=worker,
                finished_at=db_clock(using),
            )
        )
        if written != 1:
            state = _attempt_rows(key, using).values_list("state", flat=True).first()
            if state == RemoteAttemptState.FAILED:
                return _refused(key, "failure", Disposition.ALREADY_RECORDED, "this attempt's failure is already in")
            return _refused(key, "failure", Disposition.NOT_WAITING, f"this attempt is already {state}")
        send("w", key.workflow_id, using)
    return Disposition.RECORDED


def why_stale(key: AttemptKey, using: str, activity: str | None = None) -> str | None:
    """Why the attempt is no longer wanted, or None while it is (unlocked reads: a hint, not a fence).
    With ``activity``, a delivery naming another activity than the step's is refused: a message forged
    on the broker cannot run a different registered activity and have its result recorded."""
    claim = claims.holder(key.workflow_id, using)
    if claim is None:
        return "the workflow no longer exists"
    epoch, holder = claim
    if epoch != key.epoch:
        return f"the workflow is at epoch {epoch} now (taken over, cancelled, suspended or retried)"
    if holder is None:
        return "no engine holds the workflow at this epoch (it finished, or its engine released it)"
    step = (
        Step.objects.using(using)
        .filter(run_id=key.run_id, seq=key.seq)
        .values_list("status", "attempts", "name")
        .first()
    )
    if step is None:
        # The engine commits a step before it sends the attempt, and its steps outlive the claim: a
        # claimed workflow without the run's step never sent this message (the id and a small epoch
        # matched by chance). Name the misrouting: the sending engine only sees its attempt time out.
        return (
            f"run {key.run_id} has no step {key.seq} in this database: the message was sent by an engine on "
            "another database; give each deployment its own broker (or Redis database or key prefix)"
        )
    if step[:2] != (StepStatus.RUNNING, key.attempt):
        return "the step no longer waits for this attempt"
    if activity is not None and step[2] != activity:
        return f"the step runs activity {step[2]!r}, not {activity!r} (a message the engine did not send)"
    state = _attempt_rows(key, using).values_list("state", flat=True).first()
    if state in (RemoteAttemptState.FAILED, RemoteAttemptState.EXPIRED):
        return f"this attempt is already {state}"
    return None


def heartbeat(key: AttemptKey, details: str, worker: str, using: str) -> str | None:
    """Store the latest heartbeat details; return why the attempt should stop, or None."""
    reason = why_stale(key, using)
    if reason is not None:
        return reason
    fields = {"details": details, "heartbeat_at": db_clock(using), "worker": worker}
    if _attempt_rows(key, using).filter(state=RemoteAttemptState.SENT).update(**fields):
        return None
    # Its row is gone (the step's result is in) or settled since the look above: never re-create it.
    state = _attempt_rows(key, using).values_list("state", flat=True).first()
    return f"this attempt is already {state}" if state else "the step's result is in"


def _ensure_row(key: AttemptKey, activity: str, queue: str, using: str) -> None:
    RemoteAttempt.objects.using(using).bulk_create([_row(key, activity, queue, db_clock(using))], ignore_conflicts=True)


def _row(key: AttemptKey, activity: str, queue: str, now: Any) -> RemoteAttempt:
    return RemoteAttempt(
        workflow_id=key.workflow_id,
        run_id=key.run_id,
        seq=key.seq,
        attempt=key.attempt,
        epoch=key.epoch,
        activity=activity,
        queue=queue,
        sent_at=now,
    )


class WorkerControl(AttemptControl):
    """A worker's side of an attempt: ``weft.heartbeat()`` details go to the attempt's RemoteAttempt row
    (at most once per HEARTBEAT_INTERVAL), and that write reads back whether the attempt should stop
    (then the heartbeat raises ActivityCancelledError). Inside an atomic activity's transaction the
    details are not written, only the stop is looked up."""

    def __init__(self, info: ActivityInfo, key: AttemptKey, worker: str, using: str) -> None:
        super().__init__(info)
        self._key, self._worker, self._using = key, worker, using
        self._flushed_at: float | None = None

    @property
    def details(self) -> Any:
        return self._details

    @details.setter
    def details(self, value: Any) -> None:
        self._details = value
        if not hasattr(self, "_key"):  # AttemptControl.__init__
            return
        text = encode(value, path="heartbeat details", max_bytes=payload_max_bytes())
        now = time.monotonic()
        if self._flushed_at is not None and now - self._flushed_at < HEARTBEAT_INTERVAL:
            return
        self._flushed_at = now
        try:
            if connections[self._using].in_atomic_block:
                # An atomic=True activity: a write here would join its transaction (and lock the row the
                # owner's expiry writes); only look whether to stop.
                reason = why_stale(self._key, self._using)
            else:
                reason = heartbeat(self._key, text, self._worker, self._using)
        except DatabaseError as exc:
            logger.warning("heartbeat not written workflow=%s error=%s", self._key.workflow_id, exc)
            connections[self._using].close()
            return
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason


class _Refusal(Exception):
    def __init__(self, disposition: Disposition) -> None:
        super().__init__(str(disposition))
        self.disposition = disposition


def run_attempt(
    key: AttemptKey,
    activity: str,
    args_text: str,
    *,
    worker: str = "",
    using: str | None = None,
    trace_context: str | None = None,
) -> str:
    """Run one delivered attempt on a worker and commit its outcome, fenced. Returns what happened:
    a Disposition, ``"skipped"`` (no longer wanted: not run) or ``"stopped"`` (asked to stop).
    ``trace_context``: its run's, sent with the message (the attempt's span is a child of it)."""
    ident = (key.workflow_id, key.run_id, activity, key.seq, key.attempt, key.epoch)
    with attempt_span(*ident, trace_context, worker=worker or "celery") as span:
        disposition = _run_attempt(key, activity, args_text, worker, using or database_alias())
        tracing.set_attribute(span, "weft.outcome", str(disposition))
        return disposition


def _run_attempt(key: AttemptKey, activity: str, args_text: str, worker: str, using: str) -> str:
    # Connections: Celery's Django fixup closes unusable or expired ones around every task.
    reason = why_stale(key, using, activity)
    if reason is not None:
        logger.warning(
            "remote attempt skipped workflow=%s seq=%s attempt=%s epoch=%s reason=%s",
            key.workflow_id,
            key.seq,
            key.attempt,
            key.epoch,
            reason,
        )
        return "skipped"
    info = ActivityInfo(
        workflow_id=key.workflow_id,
        run_id=key.run_id,
        activity=activity,
        seq=key.seq,
        attempt=key.attempt,
        epoch=key.epoch,
        idempotency_key=f"{key.workflow_id}:{key.run_id}:{key.seq}",
    )
    control = WorkerControl(info, key, worker, using)
    bind(control)
    try:
        return _run(key, activity, args_text, control, worker, using)
    finally:
        bind(None)


def _run(key: AttemptKey, activity: str, args_text: str, control: WorkerControl, worker: str, using: str) -> str:
    try:
        definition = registry.activity(activity)
        payload = decode(args_text) or {}
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        if definition.atomic:
            return _run_atomic(key, definition.fn, args, kwargs, using)
        result = encode_payload(definition.fn(*args, **kwargs), path="activity result")
    except BaseException as exc:  # SystemExit too: the attempt's failure, as on the thread executor
        if propagates(exc, worker=True):  # Ctrl+C, Celery's WorkerTerminate / WorkerShutdown: the worker's
            raise
        if isinstance(exc, ActivityCancelledError) and control.stop_reason is not None:
            logger.info(
                "remote attempt stopped workflow=%s seq=%s reason=%s", key.workflow_id, key.seq, control.stop_reason
            )
            return "stopped"
        logger.info(
            "activity failed workflow=%s activity=%s seq=%s attempt=%s error=%s",
            key.workflow_id,
            activity,
            key.seq,
            key.attempt,
            type(exc).__name__,
        )
        failure, types = describe_exception(exc), exception_types(exc)
        return _commit(lambda: fail(key, activity, failure, types, worker, using), using)
    return _commit(lambda: complete(key, result, using), using)


def _run_atomic(key: AttemptKey, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], using: str) -> str:
    """The user's writes and the step commit in one transaction, the claim locked last; a refused
    result rolls the writes back. An exception here (a database error too) is the attempt's failure,
    as on the thread executor."""
    try:
        with transaction.atomic(using=using):
            result = encode_payload(fn(*args, **kwargs), path="activity result")
            disposition = complete(key, result, using)
            if disposition is not Disposition.RECORDED:
                raise _Refusal(disposition)
            return disposition
    except _Refusal as refusal:
        return refusal.disposition


def _commit(write: Callable[[], Disposition], using: str) -> Disposition:
    """Retry an outcome's commit after database errors: each write is idempotent (a retried success
    finds its own result, ALREADY_RECORDED). When the database stays away, give up: the owner's
    per-attempt timeout sends the attempt again."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return write()
        except DatabaseError as exc:
            connections[using].close()
            if attempt == COMMIT_ATTEMPTS:
                raise
            logger.warning("remote outcome commit failed (try %s) error=%s; retrying", attempt, exc)
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


# -- the engine's side ------------------------------------------------------------------------------
class Expiry(enum.Enum):
    EXPIRED = "expired"  # fenced out: the worker can no longer commit this attempt
    SETTLED = "settled"  # the worker committed first: use the outcome
    NOT_HELD = "not held"  # this engine no longer holds the workflow at the attempt's epoch
    BUSY = "busy"  # still ours, but another transaction holds the claim or attempt row: try again on a later poll


class RemoteControl(AttemptControl):
    """The engine's side of a remote attempt. ``lock`` stays held (the attempt may commit any time)
    until its expiry is committed or its outcome read, so the engine never times it out from memory
    alone; ``details`` are the latest heartbeat the worker wrote; a stop request forgets the attempt
    (the worker finds out from the database)."""

    def __init__(self, info: ActivityInfo, key: AttemptKey, using: str, on_stop: Callable[[AttemptKey], None]):
        super().__init__(info)
        self.key, self._using, self._on_stop = key, using, on_stop
        self.sent = False
        self.lock.acquire()

    @property
    def details(self) -> Any:
        if not hasattr(self, "key"):
            return None
        return latest_details(self.key, self._using)

    @details.setter
    def details(self, value: Any) -> None:
        """Heartbeats of remote attempts are written by the worker, not here."""

    def request_stop(self, reason: str) -> None:
        super().request_stop(reason)
        self._on_stop(self.key)


def record_sent(entries: list[tuple[AttemptKey, str, str]], using: str) -> None:
    """Write (key, activity, queue) rows for attempts about to be sent (kept if already there)."""
    if entries:
        now = db_clock(using)
        RemoteAttempt.objects.using(using).bulk_create(
            [_row(key, activity, queue, now) for key, activity, queue in entries], ignore_conflicts=True
        )


def expire(engine_id: str, key: AttemptKey, activity: str, using: str) -> tuple[Expiry, RemoteOutcome | None]:
    """Time the attempt out under this engine's claim, unless the worker's outcome is in already."""
    return expire_many(engine_id, [(key, activity)], using)[key.ident]


def expire_many(
    engine_id: str, entries: list[tuple[AttemptKey, str]], using: str
) -> dict[tuple[str, int, int, int], tuple[Expiry, RemoteOutcome | None]]:
    """``expire`` for many attempts, in one transaction whose statements do not grow with them (the
    claims locked first, sorted; then per chunk the steps and rows read, the rows written and marked
    ``expired``). Each is fenced as alone: under its workflow's claim still held by ``engine_id`` at its
    epoch, only the row of its (run, seq, attempt, epoch). Returns ``{key.ident: (Expiry, outcome)}``.
    Raises ValueError for two entries of one workflow at different epochs (at most one can be held)."""
    epochs: dict[str, int] = {}
    for key, _ in entries:
        if epochs.setdefault(key.workflow_id, key.epoch) != key.epoch:
            raise ValueError(f"expire_many: two epochs of workflow {key.workflow_id!r}")
    found: dict[tuple[str, int, int, int], tuple[Expiry, RemoteOutcome | None]] = {}
    if not entries:
        return found
    # On the engine's loop thread: never wait for a claim row another transaction holds.
    with fenced(epochs, using, holder=(engine_id, epochs), wait=False) as fence:
        unheld = {wid: epoch for wid, epoch in epochs.items() if wid not in fence.held}
        _, busy = claims.classify_unheld(engine_id, unheld, using)
        for key, _ in entries:
            if key.workflow_id not in fence.held:
                found[key.ident] = (Expiry.BUSY if key.workflow_id in busy else Expiry.NOT_HELD), None
        held = [(key, activity) for key, activity in entries if key.workflow_id in fence.held]
        steps = _steps([key for key, _ in held], using)
        waiting: list[tuple[AttemptKey, str]] = []
        for key, activity in held:
            step = steps.get((key.run_id, key.seq))
            if step is not None and step[:3] == (StepStatus.COMPLETED, key.attempt, key.epoch):
                found[key.ident] = Expiry.SETTLED, RemoteOutcome(ok=True, result=step[3], completed_at=step[4])
            else:
                waiting.append((key, activity))
        if not waiting:
            return found
        now = db_clock(using)
        RemoteAttempt.objects.using(using).bulk_create(
            [_row(key, activity, "", now) for key, activity in waiting], ignore_conflicts=True
        )
        rows = _rows([key for key, _ in waiting], using, lock=True)
        expiring: list[AttemptKey] = []
        for key, _ in waiting:
            if key.ident not in rows:  # its row (there now) is held elsewhere, a user's transaction: a later poll
                found[key.ident] = Expiry.BUSY, None
                continue
            row = rows[key.ident]
            if row[0] == RemoteAttemptState.FAILED:
                found[key.ident] = (
                    Expiry.SETTLED,
                    RemoteOutcome(ok=False, error=row[1], error_types=recorded_types(row[2])),
                )
            else:
                expiring.append(key)
                found[key.ident] = Expiry.EXPIRED, None
        for chunk in backend(using).chunks(expiring, per_item=4, reserved=4):
            RemoteAttempt.objects.using(using).filter(_where_attempts(chunk)).update(
                state=RemoteAttemptState.EXPIRED, finished_at=now
            )
    return found


def _where_attempts(keys: list[AttemptKey]) -> Q:
    return functools.reduce(
        operator.or_, (Q(run_id=k.run_id, seq=k.seq, attempt=k.attempt, epoch=k.epoch) for k in keys)
    )


def _steps(keys: list[AttemptKey], using: str) -> dict[tuple[str, int], tuple[Any, ...]]:
    """(status, attempts, epoch, result, completed_at) of these attempts' steps, by (run_id, seq)."""
    wanted = sorted({(k.run_id, k.seq) for k in keys})
    steps: dict[tuple[str, int], tuple[Any, ...]] = {}
    for chunk in backend(using).chunks(wanted, per_item=2):
        where = functools.reduce(operator.or_, (Q(run_id=run, seq=seq) for run, seq in chunk))
        for run_id, seq, *rest in (
            Step.objects.using(using)
            .filter(where)
            .annotate(done_at=readable("completed_at"))  # a hand edit past year 9999: None, not DataError
            .values_list("run_id", "seq", "status", "attempts", "epoch", "result", "done_at")
        ):
            steps[(str(run_id), seq)] = tuple(rest)
    return steps


def _rows(
    keys: list[AttemptKey], using: str, *, lock: bool = False
) -> dict[tuple[str, int, int, int], tuple[Any, ...]]:
    """(state, error, error_types) of these attempts' RemoteAttempt rows, by ``AttemptKey.ident``;
    ``lock``: locked, leaving out those another transaction holds (the engine's loop never waits)."""
    rows: dict[tuple[str, int, int, int], tuple[Any, ...]] = {}
    found = backend(using)
    for chunk in found.chunks(keys, per_item=4):
        attempts = RemoteAttempt.objects.using(using).filter(_where_attempts(chunk))
        if lock and found.skips_locked:
            attempts = attempts.select_for_update(skip_locked=True, no_key=True).order_by("pk")
        for run_id, seq, attempt, epoch, *rest in attempts.values_list(
            "run_id", "seq", "attempt", "epoch", "state", "error", "error_types"
        ):
            rows[(str(run_id), seq, attempt, epoch)] = tuple(rest)
    return rows


def poll(keys: list[AttemptKey], using: str) -> dict[AttemptKey, RemoteOutcome]:
    """The outcomes workers committed for these attempts, and those timed out already (``expired``):
    two queries per CHUNK runs."""
    wanted = {key.ident: key for key in keys}
    seqs: dict[str, set[int]] = {}
    for key in keys:
        seqs.setdefault(key.run_id, set()).add(key.seq)
    found: dict[AttemptKey, RemoteOutcome] = {}
    runs = sorted(seqs)
    for start in range(0, len(runs), CHUNK):
        where = functools.reduce(
            operator.or_, (Q(run_id=run, seq__in=sorted(seqs[run])) for run in runs[start : start + CHUNK])
        )
        completed = (
            Step.objects.using(using)
            .filter(where, status=StepStatus.COMPLETED)
            .annotate(done_at=readable("completed_at"))  # a hand edit past year 9999: None, not DataError
            .values_list("run_id", "seq", "attempts", "epoch", "result", "done_at")
        )
        for run_id, seq, attempt, epoch, result, completed_at in completed:
            done = wanted.get((str(run_id), seq, attempt, epoch))
            if done is not None:
                found[done] = RemoteOutcome(ok=True, result=result, completed_at=completed_at)
        ended = (
            RemoteAttempt.objects.using(using)
            .filter(where, state__in=(RemoteAttemptState.FAILED, RemoteAttemptState.EXPIRED))
            .values_list("run_id", "seq", "attempt", "epoch", "state", "error", "error_types")
        )
        for run_id, seq, attempt, epoch, state, error, types in ended:
            raised = wanted.get((str(run_id), seq, attempt, epoch))
            if raised is not None and raised not in found:
                if state == RemoteAttemptState.EXPIRED:
                    found[raised] = RemoteOutcome(ok=False, expired=True)
                else:
                    found[raised] = RemoteOutcome(ok=False, error=error, error_types=recorded_types(types))
    return found


def latest_details(key: AttemptKey, using: str) -> Any:
    text = _attempt_rows(key, using).values_list("details", flat=True).first()
    return decode(text) if text is not None else None
