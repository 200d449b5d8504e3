"""Keeping one workflow's failure inside that workflow.

The driver never lets a row that cannot be decoded, or its own bug, escape (engine/driver.py: the run
fails or gets stuck). This module is the net behind it, for an exception raised anywhere else in a
pass by the handling of one workflow (a bug in weft, a row the loader cannot convert):

- ``contain_tick_failure``: a pass raised something that is not a DatabaseError. The workflow whose
  handling raised it (found in the traceback: the innermost frame working on an owned workflow) is
  made stuck with an EngineInternalError naming the exception, in a commit of its own; nothing else
  of the pass was committed, so every other owned workflow is reloaded from the database, as after
  a database error. The engine goes on.
- ``contain_refused_commit``: the pass's fenced commit raised. A DataError (the database refused a
  value: a deterministic fault of one workflow's writes, which reloading and running again would
  only repeat, re-running its activities each time): the batch is committed one workflow at a time,
  so the others' writes land; the one whose own writes are refused is made stuck with the
  database's reason, in a commit of its own, and retried with back-off. A lock wait that ended (a
  row the commit writes is held by a user's open transaction): the batch is committed one workflow
  at a time too, and the one whose row is held has its writes carried and tried again alone, with
  back-off (``LockedRows``), so no later batch waits for it. Any other database error: the batch's
  workflows are reloaded from what is durable.
- ``load_each``: the batched loader raised for a chunk of claimed workflows: load them one by one,
  so the one whose row cannot be read is the only one left out (made stuck when its run can be
  named, released otherwise).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol

from django.db import DatabaseError, DataError

from ..exceptions import EngineInternalError
from ..store import runs
from ..store.commit import WorkflowWrites
from ..store.damaged_rows import UnreadableRow
from ..store.histories import Loaded, RunRow, load
from ..store.sessions import lock_wait_ended
from .activities import AttemptTask
from .driver import WorkflowRun
from .owned import Owned, mark_stuck

logger = logging.getLogger("weft_django.engine.engine")
_NAMES = ("wid", "workflow_id")
SPLIT_GIVE_UP = 3  # lock waits in one split after which its other workflows are held back untried


Commit = Callable[[list[WorkflowWrites], datetime], set[str]]  # the engine's fenced commit of some writes


class LockedRows:
    """The workflows whose own commit gave up waiting for a row another transaction holds (the fence
    skips locked claims, but a write waits for its row, ``store.sessions.COMMIT_LOCK_WAIT_MS`` at
    most). Their writes stay carried and are tried again alone, with back-off (0.1 s doubling to 2 s),
    so the engine's other commits never wait for that row again. One per engine loop."""

    FIRST = 0.1
    LONGEST = 2.0

    def __init__(self) -> None:
        self._retry: dict[str, tuple[float, float]] = {}  # workflow id -> (monotonic retry time, back-off)
        self.times_blocked = 0  # how many commits gave up waiting (a split stops trying after a few)

    def sort(self, batch: list[WorkflowWrites]) -> tuple[list[WorkflowWrites], list[WorkflowWrites], set[str]]:
        """Split a commit's batch: (to commit together, the held-back workflow due to be tried alone (one
        per commit: a lock on a whole table must not cost a pass 100 ms per workflow), the held-back
        ones not tried now: deferred). A batch of one due workflow is its try."""
        if not self._retry:
            return batch, [], set()
        clock = time.monotonic()
        together: list[WorkflowWrites] = []
        alone: list[WorkflowWrites] = []
        deferred: set[str] = set()
        for writes in batch:
            entry = self._retry.get(writes.workflow_id)
            if entry is None or (entry[0] <= clock and len(batch) == 1):
                together.append(writes)
            elif entry[0] > clock or alone:
                deferred.add(writes.workflow_id)
            else:
                alone.append(writes)
        return together, alone, deferred

    def blocked(self, workflow_id: str) -> None:
        """Its commit alone gave up waiting for a row: try again later, waiting twice as long as before."""
        self.times_blocked += 1
        clock = time.monotonic()
        backoff = min(self._retry.get(workflow_id, (0.0, self.FIRST / 2))[1] * 2, self.LONGEST)
        # entries of workflows no longer driven (deposed, evicted) go once long past their retry time
        self._retry = {wid: entry for wid, entry in self._retry.items() if entry[0] > clock - 60}
        self._retry[workflow_id] = (clock + backoff, backoff)

    def forget(self, workflow_ids: Iterable[str]) -> None:
        """These committed (or are no longer driven): nothing held back for them any more."""
        if self._retry:
            for workflow_id in workflow_ids:
                self._retry.pop(workflow_id, None)


class Loop(Protocol):
    """What containment needs from the engine loop."""

    engine_id: str
    owned: dict[str, Owned]
    locked_rows: LockedRows

    def commit_stuck(self, wid: str, error: EngineInternalError) -> None: ...

    def reload_all(self) -> None: ...

    def reload_batch(self, workflow_ids: list[str]) -> None: ...


def culprit(exc: BaseException, owned: dict[str, Any]) -> str | None:
    """The owned workflow whose handling raised ``exc``: the innermost traceback frame with a local
    that is one (an Owned, a WorkflowRun, an AttemptTask, a WorkflowWrites, a RunRow, or a ``wid``)."""
    frames = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for name, value in frame.f_locals.items():
            wid = _workflow_of(name, value)
            if wid is not None and wid in owned:
                return wid
    return None


def _workflow_of(name: str, value: Any) -> str | None:
    if isinstance(value, Owned | AttemptTask | WorkflowWrites):
        return value.workflow_id
    if isinstance(value, WorkflowRun):
        return value.ctx.workflow_id
    if isinstance(value, RunRow):
        return value.id
    if name in _NAMES and isinstance(value, str):
        return value
    return None


def contain_tick_failure(engine: Loop, exc: Exception) -> bool:
    """Called by Engine.tick() for an exception of a pass that is not a DatabaseError. Returns True:
    the reloads are work still to do (run_until_idle must not stop before them).

    Args:
        engine: the loop whose pass raised.
        exc: what it raised.
    """
    wid = culprit(exc, engine.owned)
    logger.error(
        "engine pass failed engine=%s workflow=%s; %s",
        engine.engine_id,
        wid,
        "making it stuck and reloading the others" if wid else "reloading its workflows",
        exc_info=exc,
    )
    if wid is not None:
        engine.commit_stuck(wid, internal_error(wid, exc))
    engine.reload_all()  # nothing of the pass was committed: replay the others from what is durable
    time.sleep(0.2)
    return True


def contain_refused_commit(
    engine: Loop,
    batch: list[WorkflowWrites],
    now: datetime,
    exc: Exception,
    commit: Commit,
) -> set[str]:
    """Called by the engine's fenced commit when it raised ``exc``: a DatabaseError, or a
    UnicodeEncodeError (text the driver cannot encode). Returns the workflows whose commit was
    deferred (as the commit does).

    Args:
        engine: the loop.
        batch: the writes the refused commit carried.
        now: workflow time of the pass.
        exc: the database's refusal.
        commit: the engine's fenced commit, for one workflow's writes at a time.
    """
    if lock_wait_ended(exc):
        return _contain_lock_wait(engine, batch, now, exc, commit)
    if not isinstance(exc, DataError | UnicodeEncodeError):
        logger.error("fenced commit failed engine=%s; reloading its workflows", engine.engine_id, exc_info=exc)
        engine.reload_batch([writes.workflow_id for writes in batch])
        return set()
    if len(batch) > 1:
        return _one_by_one("refused a value", engine, batch, now, exc, commit)
    writes = batch[0]
    wid = writes.workflow_id
    logger.error(
        "the database refused the writes of workflow=%s engine=%s; making it stuck", wid, engine.engine_id, exc_info=exc
    )
    if wid not in engine.owned:
        return set()
    if wid in _sticking.ids:  # the stuck mark this made was refused too: commit_stuck drops it (its claim lapses)
        return set()
    _sticking.ids.add(wid)
    try:
        engine.commit_stuck(wid, internal_error(wid, exc))
    finally:
        _sticking.ids.discard(wid)
    return set()


def _one_by_one(
    why: str, engine: Loop, batch: list[WorkflowWrites], now: datetime, exc: Exception, commit: Commit
) -> set[str]:
    """The batch's commit failed for one workflow's sake: commit each workflow's writes on its own.
    After SPLIT_GIVE_UP lock waits in one split (a lock on a whole table, not one user's row), the
    rest are held back untried, as the ones that waited."""
    logger.warning(
        "fenced commit %s engine=%s; committing its %s workflows one by one: %s", why, engine.engine_id, len(batch), exc
    )
    deferred: set[str] = set()
    started = engine.locked_rows.times_blocked
    for writes in batch:
        if engine.locked_rows.times_blocked - started >= SPLIT_GIVE_UP:
            _block(engine, writes.workflow_id)
            deferred |= {writes.workflow_id} & set(engine.owned)
            continue
        deferred |= commit([writes], now)
    return deferred


def _contain_lock_wait(
    engine: Loop, batch: list[WorkflowWrites], now: datetime, exc: Exception, commit: Commit
) -> set[str]:
    if len(batch) > 1:
        return _one_by_one("gave up waiting for a row another transaction holds", engine, batch, now, exc, commit)
    wid = batch[0].workflow_id
    _block(engine, wid)
    return {wid} if wid in engine.owned else set()


def _block(engine: Loop, wid: str) -> None:
    engine.locked_rows.blocked(wid)
    logger.warning(
        "fenced commit deferred workflow=%s engine=%s: a row it writes is locked by another transaction "
        "(a user's open transaction?); its writes are carried and tried again alone",
        wid,
        engine.engine_id,
    )


class _Sticking(threading.local):
    """The workflows an engine loop (one per thread) is making stuck after a refused commit."""

    def __init__(self) -> None:
        self.ids: set[str] = set()


_sticking = _Sticking()


def internal_error(wid: str, exc: Exception) -> EngineInternalError:
    """The error a workflow is stuck with when the engine failed handling it (a bug in weft), or found
    one of its rows damaged (``UnreadableRow``: not a bug, ``unreadable_error``)."""
    if isinstance(exc, UnreadableRow):
        return unreadable_error(wid, exc)
    return EngineInternalError(
        f"Workflow {wid!r}: the engine failed while handling it ({type(exc).__name__}: {exc}). This is a bug in "
        "weft_django, not in the workflow code; the workflow is retried with back-off and the engine serves "
        "its other workflows meanwhile. Please report it with the engine's log."
    )


def load_each(
    engine_id: str,
    using: str,
    claimed: dict[str, int],
    now: datetime,
    writes: dict[str, WorkflowWrites],
    error: Exception,
) -> tuple[Loaded, set[str]]:
    """``load`` raised ``error`` (not a DatabaseError) for these claimed ids: load them one at a time.
    Returns what loaded, and the ids made stuck in ``writes`` (those that did not load and whose run
    id can be read; the caller releases the claims of the rest).

    Raises:
        DatabaseError: the database failed.
    """
    logger.error(
        "loading %d claimed workflows failed engine=%s; loading them one by one",
        len(claimed),
        engine_id,
        exc_info=error,
    )
    merged = Loaded({}, {}, {}, {}, None)
    stuck: set[str] = set()
    for wid, epoch in claimed.items():
        try:
            one = load([wid], using)
        except DatabaseError:
            raise
        except Exception as exc:
            if _unloadable(engine_id, using, wid, epoch, exc, now, writes):
                stuck.add(wid)
            continue
        merged.runs.update(one.runs)
        merged.steps.update(one.steps)
        merged.applied.update(one.applied)
        merged.timers.update(one.timers)
    return merged, stuck


def _unloadable(
    engine_id: str, using: str, wid: str, epoch: int, exc: Exception, now: datetime, writes: dict[str, WorkflowWrites]
) -> bool:
    run = runs.run_of_unreadable(wid, using)
    logger.error("workflow rows unreadable workflow=%s engine=%s error=%s", wid, engine_id, exc)
    if run is None:
        return False
    mark_stuck(engine_id, wid, run[0], epoch, run[1], unreadable_error(wid, exc), now, writes)
    return True


def unreadable_error(wid: str, exc: Exception) -> EngineInternalError:
    """The error a workflow is stuck with when one of its rows cannot be read (a hand edit)."""
    return EngineInternalError(
        f"Workflow {wid!r}: its rows cannot be read by the engine ({type(exc).__name__}: {exc}). Repair the row "
        "(a column holding a value of the wrong type or out of range), or cancel the workflow; it is retried "
        "with back-off."
    )
