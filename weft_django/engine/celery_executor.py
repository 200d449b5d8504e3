"""The Celery executor: the engine's side of activities on a Celery worker fleet (docs/celery.md).

It sends each attempt as the task ``weft_django.run_activity`` (defined in weft_django/contrib/celery.py,
which workers import), reads back the outcomes workers committed, and times attempts out. Imported
only when an attempt needs Celery (engine/executors.py), so projects without the extra never load it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery import Celery, current_app
from django.db import DatabaseError, connections

from ..exceptions import ConfigurationError
from ..store import histories
from . import remote
from .activities import AttemptOutcome, AttemptTask
from .worker_errors import is_retryable

logger = logging.getLogger("weft_django.contrib.celery")

RUN_ACTIVITY = "weft_django.run_activity"
SEND_BATCH = 500
RESEND_DELAY = 1.0  # seconds before a send that failed (broker unreachable) is tried again
# How long a sent attempt no context waits for any more (its workflow reloaded, finished or lost) is
# remembered once it is timed out (or its outcome is in): a reload at the same epoch within it takes
# the outcome from the database at once; a later one sends the attempt again, and the worker skips it.
SENT_KEPT_FOR = 60.0
PRUNE_BATCH = 500  # sends past their deadline looked at per poll (one claim read, one fenced expiry for them all)
_settings_app: Celery | None = None
_settings_app_lock = threading.Lock()


def celery_app() -> Celery:
    """The app the engine sends through: the current app when the process loaded the project's (as
    Celery's Django guide does in ``proj/__init__.py``), else one configured from the Django settings'
    ``CELERY_*`` keys."""
    app = current_app._get_current_object()
    if not _broker(app):
        app = _from_settings()
    if not _broker(app):
        raise ConfigurationError(
            'Activities with executor "celery" need a Celery broker: set CELERY_BROKER_URL in settings (read '
            'with app.config_from_object("django.conf:settings", namespace="CELERY")), and load your Celery app '
            "in the engine process (proj/__init__.py: from .celery import app as celery_app)."
        )
    return app


def _broker(app: Celery) -> bool:
    return bool(app.conf.broker_url or app.conf.broker_write_url)


def _from_settings() -> Celery:
    global _settings_app
    with _settings_app_lock:
        if _settings_app is None:
            app = Celery("weft_django", set_as_current=False)
            app.config_from_object("django.conf:settings", namespace="CELERY")
            _settings_app = app
        return _settings_app


@dataclass
class _Sent:
    """An attempt this executor sent: its deadline (``time.monotonic``), its key and activity, and whether
    its fate is in the database already (timed out, or its outcome committed) while no context waited."""

    deadline: float | None
    key: remote.AttemptKey
    activity: str
    settled: bool = False


class CeleryExecutor:
    """The engine's side: send attempts, read back the outcomes workers committed, time attempts out.

    Sending happens on a thread of its own, so a slow or unreachable broker never stalls the engine
    loop; an attempt's timeout starts once its message is sent (a send that fails is retried, and is
    not the activity's failure).

    A workflow reloaded at the same epoch (a failed pass or commit: its context is dropped and loaded
    again under the same claim) submits the attempt it waits for again, with the same key. Its message
    is already with a worker, whose result the new context will take: the attempt is not sent again
    (a second delivery passes every check a worker makes, so it would run the activity twice), and its
    timeout keeps counting from the first send. An attempt no context waits for is timed out at its
    deadline all the same (fenced, as for a waiting context): a reload that comes later finds it timed
    out, whatever it waited for meanwhile."""

    def __init__(
        self,
        engine_id: str,
        outcomes: queue.SimpleQueue[AttemptOutcome],
        using: str,
        poll_interval: float,
        app: Celery | None = None,
    ) -> None:
        self.app = app or celery_app()
        self.outcomes = outcomes
        self._engine_id = engine_id
        self._using = using
        self._poll_interval = poll_interval
        self._running: dict[tuple[str, int, int, int], AttemptTask] = {}
        # The deadline of every attempt this executor sent whose outcome it has not settled or expired yet.
        self._sent: dict[tuple[str, int, int, int], _Sent] = {}
        self._lock = threading.Lock()
        self._outbox: queue.SimpleQueue[AttemptTask | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._sender: threading.Thread | None = None
        self._last_poll = 0.0

    # -- sending --------------------------------------------------------------------------------------
    def submit(self, task: AttemptTask) -> None:
        key = remote.AttemptKey(task.workflow_id, task.run_id, task.seq, task.attempt, task.epoch)
        task.control = remote.RemoteControl(task.control.info, key, self._using, self._forget)
        with self._lock:
            self._running[task.key] = task
            if self._adopt(task):
                return
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_loop, name="weft-celery-send", daemon=True)
                self._sender.start()
        self._outbox.put(task)

    def _send_loop(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._next_batch()
                if not batch:
                    continue
                try:
                    unsent = self._send(batch)
                except Exception:  # never let the sender die: the attempts would wait for ever
                    logger.exception("sending activities failed engine=%s; retrying", self._engine_id)
                    unsent = batch
                if unsent:
                    self._stop.wait(RESEND_DELAY)
                    for task in unsent:
                        self._outbox.put(task)
        finally:
            connections.close_all()  # this thread's connections

    def _next_batch(self) -> list[AttemptTask]:
        try:
            first = self._outbox.get(timeout=0.5)
        except queue.Empty:
            return []
        batch = [first]
        while len(batch) < SEND_BATCH:
            try:
                batch.append(self._outbox.get_nowait())
            except queue.Empty:
                break
        with self._lock:  # not those stopped meanwhile, nor those an earlier context's send covers
            return [t for t in batch if t is not None and self._running.get(t.key) is t and not self._adopt(t)]

    def _adopt(self, task: AttemptTask) -> bool:
        """Whether the attempt was sent already (by an earlier context of its workflow, at the same
        epoch): then it is in flight, with that send's deadline. Called under the lock."""
        if task.key not in self._sent:
            return False
        task.deadline = self._sent[task.key].deadline
        assert isinstance(task.control, remote.RemoteControl)
        task.control.sent = True
        return True

    def _send(self, batch: list[AttemptTask]) -> list[AttemptTask]:
        """Record the attempts as sent, then publish them; return those that could not be sent."""
        try:
            remote.record_sent([(_key(t), t.definition.name, t.definition.queue or "") for t in batch], self._using)
        except DatabaseError as exc:
            logger.warning("could not record attempts before sending them error=%s; retrying", exc)
            connections[self._using].close()
            return batch
        unsent = []
        for task in batch:
            try:
                self.app.send_task(
                    RUN_ACTIVITY,
                    kwargs={
                        "workflow_id": task.workflow_id,
                        "run_id": task.run_id,
                        "seq": task.seq,
                        "attempt": task.attempt,
                        "epoch": task.epoch,
                        "activity": task.definition.name,
                        "args_text": task.args_text,
                        **({"trace_context": task.trace_context} if task.trace_context else {}),
                    },
                    queue=task.definition.queue or None,
                    retry=True,
                    retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5},
                )
            except Exception as exc:  # the broker's errors depend on the transport
                logger.warning(
                    "could not send activity workflow=%s seq=%s error=%s; retrying", task.workflow_id, task.seq, exc
                )
                unsent.append(task)
                continue
            timeout = task.definition.timeout
            with self._lock:
                deadline = time.monotonic() + timeout.total_seconds() if timeout is not None else None
                self._sent[task.key] = _Sent(deadline, _key(task), task.definition.name)
                self._adopt(task)
                current = self._running.get(task.key)  # a newer context may wait for it by now: it takes this send
                if current is not None:
                    self._adopt(current)
        return unsent

    # -- outcomes ---------------------------------------------------------------------------------------
    def poll(self, notified: set[str]) -> None:
        """Settle attempts whose outcome a worker committed (all of them every poll interval, those of
        woken workflows at once), and time out those past their deadline, fenced (remote.expire)."""
        clock = time.monotonic()
        full = clock - self._last_poll >= self._poll_interval
        if full:
            self._last_poll = clock
            self._prune_sent(clock)
        tasks = self.running
        if not tasks:
            return
        check = [task for task in tasks if full or task.workflow_id in notified]
        settled: set[tuple[str, int, int, int]] = set()
        if check:
            by_key = {_key(task): task for task in check}
            for key, outcome in remote.poll(list(by_key), self._using).items():
                if outcome.expired:
                    self._expired(by_key[key], clock)
                else:
                    self._settle(by_key[key], outcome)
                settled.add(key.ident)
        for task in tasks:
            control = task.control
            if task.key in settled or not isinstance(control, remote.RemoteControl) or not control.sent:
                continue
            if task.deadline is None or clock < task.deadline:
                continue
            expiry, late = remote.expire(self._engine_id, control.key, task.definition.name, self._using)
            if expiry is remote.Expiry.EXPIRED:
                self._expired(task, clock)
            elif late is not None:
                self._settle(task, late)

    def _expired(self, task: AttemptTask, clock: float) -> None:
        """The attempt is fenced out (timed out): hand it to the engine's timeout path (which times out
        the attempts past their deadline whose lock it can take), now."""
        assert isinstance(task.control, remote.RemoteControl)
        self._forget(task.control.key, done=True)
        task.deadline = min(task.deadline, clock) if task.deadline is not None else clock
        task.control.lock.release()

    def _settle(self, task: AttemptTask, outcome: remote.RemoteOutcome) -> None:
        self._forget(_key(task), done=True)
        task.control.finished = True
        if outcome.ok:
            self.outcomes.put(
                AttemptOutcome(task, ok=True, result=outcome.result, committed=True, completed_at=outcome.completed_at)
            )
            return
        retryable = is_retryable(task.definition.retry, outcome.error_types)
        self.outcomes.put(AttemptOutcome(task, ok=False, error=_worker_error(outcome.error), retryable=retryable))

    def _forget(self, key: remote.AttemptKey, *, done: bool = False) -> None:
        """Stop waiting for the attempt; ``done``: its outcome is settled or it expired, so no context
        waits for its message again (else it stays known as sent: a reloaded context takes it up)."""
        with self._lock:
            self._running.pop(key.ident, None)
            if done:
                self._sent.pop(key.ident, None)

    def _prune_sent(self, clock: float) -> None:
        """Time out the sends no context waits for once past their deadline, as a waiting context's
        (remote.expire, fenced), and forget them SENT_KEPT_FOR later; forget at once those whose claim
        this engine no longer holds at their epoch (no reload at that epoch can come). Forgotten at the
        deadline without it, a reload at the same epoch that came later (its loads failing all along: a
        database outage) sent the attempt again with a new deadline: a second delivery that passes every
        check a worker makes, so the activity ran twice under one attempt number, past its timeout."""
        with self._lock:
            due = [
                (ident, sent)
                for ident, sent in self._sent.items()
                if ident not in self._running and (sent.deadline is None or _due(sent, clock))
            ][:PRUNE_BATCH]
        unsettled = {sent.key.workflow_id for _, sent in due if sent.deadline is not None and not sent.settled}
        holders = histories.claim_holders(sorted(unsettled), self._using) if unsettled else {}
        expiring = [
            (sent.key, sent.activity)
            for _, sent in due
            if sent.deadline is not None
            and not sent.settled
            and holders.get(sent.key.workflow_id) == (sent.key.epoch, self._engine_id)
        ]
        # All in one fenced transaction (remote.expire_many): after an outage a poll may find PRUNE_BATCH of them.
        outcomes = remote.expire_many(self._engine_id, expiring, self._using) if expiring else {}
        for ident, sent in due:
            if ident in outcomes:
                expiry, _ = outcomes[ident]
                if expiry is remote.Expiry.BUSY:
                    continue  # its claim row is held elsewhere: a later poll tries again
                if expiry is remote.Expiry.EXPIRED:
                    logger.info(
                        "activity timed out while its workflow was not loaded workflow=%s seq=%s attempt=%s",
                        sent.key.workflow_id,
                        sent.key.seq,
                        sent.key.attempt,
                    )
                if expiry is not remote.Expiry.NOT_HELD:
                    sent.settled = True
                    continue
            with self._lock:
                if self._sent.get(ident) is sent and ident not in self._running:
                    del self._sent[ident]

    @property
    def running(self) -> list[AttemptTask]:
        with self._lock:
            return list(self._running.values())

    def shutdown(self, wait_seconds: float) -> None:
        """Stop sending. Attempts not sent yet stay recorded as running: the next owner sends them."""
        self._stop.set()
        self._outbox.put(None)
        if self._sender is not None:
            self._sender.join(timeout=max(wait_seconds, 1.0))


def _due(sent: _Sent, clock: float) -> bool:
    """Whether a send no context waits for has work in ``_prune_sent``: past its deadline and not yet
    timed out, or timed out (its fate in the database) and SENT_KEPT_FOR past its deadline."""
    assert sent.deadline is not None
    return clock > sent.deadline + SENT_KEPT_FOR if sent.settled else clock >= sent.deadline


def _worker_error(error: Any) -> dict[str, Any]:
    """The error a worker recorded for a failed attempt. One that is not a JSON object (a hand edit of
    its RemoteAttempt row) fails the attempt saying so, as any attempt failure; it used to raise in the
    engine's pass, which made the workflow stuck as a bug in weft."""
    if error is None or isinstance(error, dict):
        return error or {}
    return {
        "type": "CorruptPayloadError",
        "message": f"the error the worker recorded for this attempt cannot be read: {error!r:.80} is not a JSON "
        "object (its RemoteAttempt row was edited?)",
    }


def _key(task: AttemptTask) -> remote.AttemptKey:
    return remote.AttemptKey(task.workflow_id, task.run_id, task.seq, task.attempt, task.epoch)
