"""Waiting for an engine: what ``result()``, ``query()`` and ``update()`` share.

They wait, so they never join the caller's transaction: each runs on a "weft-wait" thread with its own
autocommit connection (they work in ``atomic()`` blocks and ``ATOMIC_REQUESTS`` views). On PostgreSQL
one LISTEN connection per database alias (``ResultListener``) wakes every waiter of this process: engines
and transitions send ``r:<workflow id>`` when a run ends and ``a:<request id>`` when a query or update is
answered. Elsewhere the waits poll with back-off. ``close_connections()`` ends them all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import close_old_connections, connections

from .exceptions import WaitTimeoutError, WorkflowNotFoundError
from .status import TERMINAL_STATUSES
from .store import notify, runs, sessions
from .store.backend import backend

logger = logging.getLogger(__name__)

T = TypeVar("T")

WAIT_THREADS = 64
LISTEN_RECHECK = 2.0  # re-read the row this often even while listening, in case a wake-up was lost
POLL_FIRST, POLL_MAX = 0.05, 0.5


class ResultTimeoutError(WaitTimeoutError, TimeoutError):
    """result() ran past its ``timeout`` (or close_connections() ended the wait). Catch it as
    ``weft.WaitTimeoutError`` or as the builtin ``TimeoutError`` (docs/howto.md): it is both."""


class Caller(threading.Event):
    """The caller's side of one wait, shared with its weft-wait thread: set when the caller stops
    waiting (the wait ended, a cancelled coroutine, close_connections()), which also wakes the
    thread (``wake_with``). ``deadline`` (``time.monotonic()``, None: no limit) is fixed when the call
    is made, so the time a wait spends queued for a thread counts against its timeout."""

    def __init__(self, seconds: float | None) -> None:
        super().__init__()
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self._wakes: list[threading.Event] = []

    def set(self) -> None:
        super().set()
        for event in list(self._wakes):
            event.set()

    def wake_with(self, event: threading.Event) -> None:
        """Set ``event`` (the thread's wake-up) when the caller stops waiting."""
        self._wakes.append(event)
        if self.is_set():
            event.set()

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


# Why a wait ended before a weft-wait thread took it: the text of its caller's timeout error.
def unstarted_reason(closed: bool) -> str:
    if closed:
        return "close_connections() ended it before it started"
    return (
        f"it never started: all {WAIT_THREADS} weft-wait threads of this process were busy with other waits "
        f"(a result() without a timeout holds one until its run ends; give waits timeouts)"
    )


def submit(fn: Callable[..., T], *args: Any, seconds: float | None) -> tuple[Future[T], Caller]:
    """Run ``fn(*args, caller)`` on a weft-wait thread for a call that waits ``seconds`` at most."""
    caller = Caller(seconds)
    return wait_executor().submit(fn, *args, caller), caller


def finish(future: Future[T], caller: Caller, unstarted: Callable[[str], BaseException]) -> T:
    """The outcome of a wait from ``submit``. At the caller's deadline a wait still queued for a
    thread is withdrawn and ``unstarted(why)`` raised (likewise one close_connections() withdrew);
    one that started is waited for (its thread has the same deadline, and its statements give up on
    a row lock within the timeout: ``Wait``)."""
    try:
        try:
            # (exception(), not futures.wait(): a future cancelled by the pool's shutdown never wakes wait())
            future.exception(timeout=caller.remaining())  # its outcome is raised below, not here
        except futures.TimeoutError:
            if future.cancel():
                raise unstarted(unstarted_reason(closed=False)) from None
        except futures.CancelledError:
            pass  # close_connections() withdrew it
        if future.cancelled():
            raise unstarted(unstarted_reason(closed=True))
        return future.result()
    finally:
        caller.set()


async def afinish(future: Future[T], caller: Caller, unstarted: Callable[[str], BaseException]) -> T:
    """As ``finish``, without blocking the event loop. A cancelled coroutine withdraws a wait still
    queued and ends one in progress (its thread sees the caller gone and returns)."""
    waited = asyncio.wrap_future(future)
    try:
        await asyncio.wait({waited}, timeout=caller.remaining())
        if not future.done() and future.cancel():
            raise unstarted(unstarted_reason(closed=False))
        await asyncio.wait({waited})
        if future.cancelled():
            raise unstarted(unstarted_reason(closed=True))
        return future.result()
    finally:
        waited.cancel()  # nothing once done; else the outcome is not delivered to a loop that may be gone
        caller.set()


class Wait:
    """The waiting half of a query or update, on a weft-wait thread: wake-ups by LISTEN on
    PostgreSQL (re-reading every LISTEN_RECHECK anyway), polling with back-off elsewhere.

    Its deadline is the caller's (``Caller``; else ``seconds`` from now), and a statement of the wait
    waits for a row lock ``seconds`` at most (``sessions.bound_lock_wait``): a row held by a
    transaction that does not end, such as the caller's own, open around the call, ends the wait with
    an error ``lock_wait_ended`` recognises instead of blocking the thread, and its caller, for ever."""

    def __init__(self, alias: str, seconds: float, abandoned: threading.Event) -> None:
        self.alias = alias
        self.seconds = seconds
        deadline = abandoned.deadline if isinstance(abandoned, Caller) else None
        self.deadline = time.monotonic() + seconds if deadline is None else deadline
        self.abandoned = abandoned
        self.listener = listener_for(alias)
        self.event = threading.Event()
        self.keys: list[str] = []
        self.delay = POLL_FIRST
        self.reconnected = False
        _reuse_or_close(alias)
        try:
            sessions.bound_lock_wait(alias, seconds)
        except BaseException:
            _keep_or_close(alias)
            raise
        _open_waits.add(abandoned)
        if isinstance(abandoned, Caller):
            abandoned.wake_with(self.event)

    def __enter__(self) -> Wait:
        return self

    def __exit__(self, *exc: object) -> None:
        _open_waits.discard(self.abandoned)
        if self.listener is not None:
            for key in self.keys:
                self.listener.unsubscribe(key, self.event)
        _keep_or_close(self.alias)

    def reconnect(self) -> bool:
        """After this thread's connection was lost (``queries_and_updates.lost``): a new one, with the
        wait's lock bound, once per wait. False when the wait had its one new connection already."""
        if self.reconnected:
            return False
        self.reconnected = True
        connections[self.alias].close()
        sessions.bound_lock_wait(self.alias, self.seconds)
        return True

    def subscribe(self, key: str) -> None:
        if self.listener is not None and key not in self.keys:
            self.listener.subscribe(key, self.event)
            self.keys.append(key)
            self.listener.listening.wait(max(0.0, min(1.0, self.remaining())))

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    @property
    def over(self) -> bool:
        return self.remaining() <= 0 or self.abandoned.is_set()

    def pause(self, at_most: float | None = None) -> None:
        remaining = max(0.0, self.remaining())
        if at_most is not None:
            remaining = min(remaining, at_most)
        if self.listener is not None and self.listener.listening.is_set():
            self.event.wait(min(remaining, LISTEN_RECHECK))
        else:
            self.event.wait(min(remaining, self.delay))
            self.delay = min(self.delay * 2, POLL_MAX)
        self.event.clear()

    def db_deadline(self, now: datetime) -> datetime:
        """When the caller stops waiting, in workflow time (``now`` is db_now())."""
        return now + timedelta(seconds=max(0.0, self.remaining()))

    def timeout_text(self) -> str:
        return f"{self.seconds:g}s"


class ResultListener:
    """One LISTEN connection per database alias, shared by every wait in this process (``result()``,
    ``query()``, ``update()``), plus one reader connection on which ``result()`` re-reads the row.

    Engines and transitions send ``r:<workflow_id>`` when a run ends; each notification wakes the
    waiters of that id, which then re-read the row. Both connections are opened on the first waiter
    and kept while waits keep coming: they close LINGER seconds after the last waiter left (or at
    close_connections()), so back-to-back waits never pay a connection set-up, while an idle process
    holds no connection (a lingering one would, for one, block dropping a test database).
    """

    POLL = 0.2  # how often the listening thread looks for departed waiters
    LINGER = 1.0  # keep both connections this long after the last waiter left

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        # A run's outcome carried by its R: wake-up, per waiting event, until that waiter takes it.
        self._delivered: dict[threading.Event, dict[str, Any]] = {}
        self._thread: threading.Thread | None = None  # None once the thread has decided to stop
        self._last_thread: threading.Thread | None = None
        self._idle_since: float | None = None
        self._closing = False
        self._read_lock = threading.Lock()
        self._reader: Any = None
        self.listening = threading.Event()

    def subscribe(self, workflow_id: str, event: threading.Event | None = None) -> threading.Event:
        event = event or threading.Event()
        with self._lock:
            self._waiters.setdefault(workflow_id, set()).add(event)
            self._idle_since = None
            if self._thread is None:
                self._closing = False
                self.listening.clear()
                self._thread = threading.Thread(target=self._run, name=f"weft-wait-listen-{self.alias}", daemon=True)
                self._last_thread = self._thread
                self._thread.start()
        return event

    def unsubscribe(self, workflow_id: str, event: threading.Event) -> None:
        with self._lock:
            self._delivered.pop(event, None)
            events = self._waiters.get(workflow_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[workflow_id]

    def closed(self) -> bool:
        """True when no listening thread (and so no connection) is left."""
        thread = self._last_thread
        return thread is None or not thread.is_alive()

    def close_soon(self) -> None:
        """Close both connections as soon as nobody waits, without lingering."""
        with self._lock:
            self._closing = True
        self.wake_all()

    def join(self, timeout: float) -> None:
        thread = self._last_thread
        if thread is not None:
            thread.join(timeout)

    def _idle(self) -> bool:
        """True (and the thread is forgotten) once nobody has waited for LINGER seconds."""
        with self._lock:
            if self._waiters:
                self._idle_since = None
                return False
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
            if not self._closing and now - self._idle_since < self.LINGER:
                return False
            self._thread = None
            self.listening.clear()
            return True

    def wake_all(self) -> None:
        self._wake(None)

    def _wake(self, workflow_id: str | None, ended: dict[str, Any] | None = None) -> None:
        with self._lock:
            if workflow_id is None:
                events = [event for group in self._waiters.values() for event in group]
            else:
                events = list(self._waiters.get(workflow_id, ()))
            if ended is not None:
                for event in events:
                    self._delivered[event] = ended
        for event in events:
            event.set()

    def take_delivered(self, event: threading.Event) -> dict[str, Any] | None:
        """The outcome an R: wake-up brought to this waiter since its last call (None: read the row)."""
        with self._lock:
            return self._delivered.pop(event, None)

    def read(self, reading: Callable[[Any], T]) -> T:
        """Run ``reading(reader)`` on the reader connection (opened on first use, kept like the LISTEN
        one). Callers are subscribed waiters, so the listening thread does not close it under them."""
        with self._read_lock:
            try:
                if self._reader is None or self._reader.closed:
                    self._reader = notify.open_reader(self.alias)
                return reading(self._reader)
            except Exception:
                self._close_reader_locked()
                raise

    def _close_reader_locked(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            try:
                reader.close()
            except Exception:
                logger.debug("weft result reader: close failed", exc_info=True)

    def _run(self) -> None:
        backoff = 0.1
        try:
            while not self._idle():
                try:
                    with notify.connect(self.alias) as conn:
                        notify.listen(conn)
                        self.listening.set()
                        self._wake(None)  # a run may have ended before LISTEN took effect: re-check all
                        backoff = 0.1
                        while not self._idle():
                            for note in conn.notifies(timeout=self.POLL):
                                kind, _, ident = note.payload.partition(":")
                                if kind == "r":
                                    self._wake(None if ident == "*" else ident)
                                elif kind == "R":  # a run ended, its outcome in the payload
                                    parsed = notify.parse_ended(ident)
                                    if parsed is None:
                                        self._wake(None)
                                    else:
                                        self._wake(parsed[0], parsed[1])
                                elif kind == "a":  # a query or update answered: "a:<request id>"
                                    self._wake(None if ident == "*" else note.payload)
                except Exception:
                    logger.warning(
                        "weft result listener lost its connection (alias=%s); polling meanwhile",
                        self.alias,
                        exc_info=True,
                    )
                    self.listening.clear()
                    self._wake(None)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
        finally:
            with self._read_lock:
                self._close_reader_locked()


_listeners: dict[str, ResultListener] = {}
_listeners_lock = threading.Lock()
_executor_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def wait_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=WAIT_THREADS, thread_name_prefix="weft-wait")
        return _executor


_open_waits: set[threading.Event] = set()  # the callers' flags (``Caller``) of the waits in progress

# The weft-wait threads' Django connections kept between waits (PostgreSQL), each with the time
# (``time.monotonic()``) its last wait ended; a wait takes its thread's out while it runs. Django
# closes connections by CONN_MAX_AGE only around requests (request_started / request_finished), never
# on a thread of its own like these, so weft closes an idle one itself, WAIT_CONNECTION_IDLE after.
WAIT_CONNECTION_IDLE = 10.0
_kept: dict[Any, float] = {}
_kept_lock = threading.Lock()
_closer: threading.Thread | None = None  # closes idle kept connections; gone while none is kept


def _keep_or_close(alias: str) -> None:
    """After a wait on a weft-wait thread: on PostgreSQL keep the thread's Django connection for its
    next wait (a connection set-up per call otherwise, whatever CONN_MAX_AGE says), until it has been
    idle WAIT_CONNECTION_IDLE seconds (``_close_idle``) or close_connections(). Elsewhere close it as
    Django would (CONN_MAX_AGE); a connection that is broken, or in a transaction, is closed."""
    global _closer
    wrapper = connections[alias]
    if not backend(alias).listens or wrapper.connection is None:
        close_old_connections()
        return
    if (wrapper.errors_occurred and not wrapper.is_usable()) or not wrapper.get_autocommit() or wrapper.in_atomic_block:
        wrapper.close()
        return
    wrapper.errors_occurred = False
    with _kept_lock:
        if wrapper not in _kept:
            wrapper.inc_thread_sharing()  # so that another thread may close it while it is idle
        _kept[wrapper] = time.monotonic()
        if _closer is None:
            _closer = threading.Thread(target=_close_idle, name="weft-wait-closer", daemon=True)
            _closer.start()


def _reuse_or_close(alias: str) -> None:
    """Before a wait: take this thread's kept connection (no other thread closes it while the wait
    runs) and reuse it if it still works, else start clean."""
    wrapper = connections[alias]
    with _kept_lock:
        kept = _kept.pop(wrapper, None) is not None
        if kept:
            wrapper.dec_thread_sharing()
    if not kept:
        close_old_connections()
    elif not wrapper.is_usable():
        wrapper.close()


def _close_idle() -> None:
    """The closer thread: close each kept connection once it has been idle WAIT_CONNECTION_IDLE
    seconds; end when none is kept (the next kept one starts it again)."""
    global _closer
    while True:
        with _kept_lock:
            now = time.monotonic()
            for wrapper, idle_since in list(_kept.items()):
                if now - idle_since >= WAIT_CONNECTION_IDLE:
                    del _kept[wrapper]  # under the lock: its thread cannot take it meanwhile
                    _close_kept(wrapper)
            if not _kept:
                _closer = None
                return
            next_at = min(_kept.values()) + WAIT_CONNECTION_IDLE
        time.sleep(min(max(0.01, next_at - time.monotonic()), WAIT_CONNECTION_IDLE))


def _close_kept(wrapper: Any) -> None:
    try:
        wrapper.close()
    except Exception:
        logger.debug("weft wait connection: close failed", exc_info=True)
    wrapper.dec_thread_sharing()


def close_connections(timeout: float = 5.0) -> None:
    """End every wait in progress or queued (its caller gets the call's timeout error: for result(),
    ResultTimeoutError, a TimeoutError), stop the weft-wait threads and close the result listeners'
    connections. For test teardown (before the test database is dropped) and orderly shutdown; the
    next result() starts them again."""
    global _executor
    with _executor_lock:
        executor, _executor = _executor, None
    for flag in list(_open_waits):
        flag.set()
    with _listeners_lock:
        listeners = list(_listeners.values())
    for listener in listeners:
        listener.close_soon()
    if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)
    with _kept_lock:
        for wrapper in list(_kept):  # the threads are gone: close what they kept
            _close_kept(wrapper)
        _kept.clear()
    for listener in listeners:
        listener.join(timeout)


def _forget_threads_after_fork() -> None:
    """A forked child (a pre-fork server, Celery's prefork pool) has none of the parent's threads."""
    global _executor, _listeners, _listeners_lock, _executor_lock, _open_waits, _kept, _kept_lock, _closer
    _executor, _listeners, _open_waits, _kept, _closer = None, {}, set(), {}, None
    _listeners_lock, _executor_lock, _kept_lock = threading.Lock(), threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_threads_after_fork)


def listener_for(alias: str) -> ResultListener | None:
    """The LISTEN connection of ``alias`` shared by this process's waits; None where the database
    has no LISTEN/NOTIFY (the waits poll)."""
    if not backend(alias).listens:
        return None
    with _listeners_lock:
        if alias not in _listeners:
            _listeners[alias] = ResultListener(alias)
        return _listeners[alias]


def _read_end(workflow_id: str, alias: str, listener: ResultListener | None) -> dict[str, Any] | None:
    """The run's terminal fields: on the listener's reader connection when there is one (no
    connection set-up per wait, whatever CONN_MAX_AGE says), else through Django."""
    if listener is not None:
        try:
            return listener.read(lambda reader: runs.read_end_on(reader, workflow_id))
        except Exception:
            logger.warning("weft result reader failed (alias=%s); reading through Django", alias, exc_info=True)
    return runs.read_end(workflow_id, alias)


def wait_for_end(workflow_id: str, alias: str, seen: tuple[str, datetime] | None, caller: Caller) -> dict[str, Any]:
    """On a weft-wait thread: poll (woken by LISTEN on PostgreSQL) until the run is terminal, or the
    caller's deadline (``Caller``). Its thread's Django connection (used only when the reader
    connection fails) is kept or closed as a query's or update's (``_keep_or_close``). ``seen``: (run
    id, created_at) of the run the caller's open transaction sees (``runs.read_start``), when it has
    one: a run older than that, committed, is not the one the caller means (its transaction started
    another over it and has not committed)."""
    _reuse_or_close(alias)
    deadline = caller.deadline
    _open_waits.add(caller)
    listener = listener_for(alias)
    event = listener.subscribe(workflow_id) if listener is not None else threading.Event()
    caller.wake_with(event)
    try:
        if listener is not None:
            listener.listening.wait(min(1.0, _remaining(deadline)))
        delay = POLL_FIRST
        run_id = None  # of the run the last read saw
        while True:
            event.clear()
            # The outcome a wake-up carried, when it is the end of the very run the last read saw
            # running (an older run's late wake-up is not); else a read.
            delivered = listener.take_delivered(event) if listener is not None else None
            row: dict[str, Any] | None
            if delivered is not None and run_id is not None and str(delivered["run_id"]) == run_id:
                row = delivered
            else:
                row = _read_end(workflow_id, alias, listener)
                run_id = None if row is None else str(row["run_id"])
            if row is None:
                raise WorkflowNotFoundError(
                    f'No workflow "{workflow_id}" exists (never started, purged, or started in a transaction '
                    f"that has not committed yet: result() reads committed data on its own connection)."
                )
            created = row["created_at"]  # None: a value Python cannot hold (a hand edit), not older
            if seen is not None and run_id != seen[0] and created is not None and created < seen[1]:
                raise WorkflowNotFoundError(
                    f'Run {seen[0]} of workflow "{workflow_id}" was started in a transaction that has not committed '
                    f"yet (yours, around this call?), over run {run_id} ({row['status']}). result() reads committed "
                    f"data on its own connection: call it after that transaction commits."
                )
            seen = None  # the first read is the one that can be older than the caller's view
            if row["status"] in TERMINAL_STATUSES:
                return row
            remaining = _remaining(deadline)
            if remaining <= 0:
                raise ResultTimeoutError(
                    f'Workflow "{workflow_id}" is still {row["status"]}; the wait for its result timed out. '
                    f"Call result() again (the run goes on), or pass a longer timeout."
                )
            if caller.is_set():
                raise ResultTimeoutError(
                    f'The wait for the result of workflow "{workflow_id}" was ended (close_connections(), or the '
                    f"caller stopped waiting); the run goes on. Call result() again."
                )
            if listener is not None and listener.listening.is_set():
                event.wait(min(remaining, LISTEN_RECHECK))
            else:
                event.wait(min(remaining, delay))
                delay = min(delay * 2, POLL_MAX)
    finally:
        _open_waits.discard(caller)
        if listener is not None:
            listener.unsubscribe(workflow_id, event)
        _keep_or_close(alias)


def _remaining(deadline: float | None) -> float:
    return float("inf") if deadline is None else deadline - time.monotonic()
