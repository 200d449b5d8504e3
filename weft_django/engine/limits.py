"""Activity limits at dispatch (``@weft.activity(concurrency=, rate=, concurrency_key=)``): an attempt of a
limited activity is handed to its executor only once ``store.limits.take_slot`` gave it a slot; until
then it waits here (its per-attempt timeout not running, as in the thread pool's queue), tried again
every ``RETRY`` seconds in dispatch order. Slots are released when their attempt is no longer running
in the executor (outcome reported, stopped before it ran, or finished after a timeout)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError

from ..codec import decode, storable_text
from ..store.limits import SlotRequest, release_slots, take_slot
from .activities import AttemptTask

logger = logging.getLogger(__name__)
RETRY = 0.05  # seconds between tries of the waiting attempts


def attempt_key(task: AttemptTask) -> str | None:
    """The attempt's concurrency key: the activity's ``concurrency_key`` (a fixed string, or a callable of
    the attempt's arguments), as a string, or None."""
    chooser = task.definition.limits.key
    if chooser is None:
        return None
    # Stored with a NUL or a lone surrogate escaped (codec.storable_text): stored as it was, the slot
    # request failed on every try and the whole activity waited behind it.
    if isinstance(chooser, str):  # a fixed key: stored as a callable's is (a NUL in it, say)
        return storable_text(chooser)[:255]
    payload = decode(task.args_text) or {}
    value = chooser(*payload.get("args", []), **payload.get("kwargs", {}))
    return None if value is None else storable_text(str(value))[:255]


class ActivityLimiter:
    """The engine's side of activity limits: waiting attempts and the slots it holds.

    Args:
        engine_id: this engine; ``using``: the connection alias.
        wake: called to wake the loop (a retry is due).
    """

    def __init__(self, engine_id: str, using: str, wake: Callable[[], None]) -> None:
        self.engine_id = engine_id
        self.using = using
        self.wake = wake
        self.waiting: list[AttemptTask] = []
        # id() of the attempt's task -> (the task, kept alive so its id is not reused; its slot id). By the
        # task, not its key: a stopped attempt still running and its reload's share (run, seq, attempt, epoch).
        self.held: dict[int, tuple[AttemptTask, int]] = {}
        self._next_try = 0.0
        self._timer: threading.Timer | None = None

    def admit(self, task: AttemptTask) -> bool:
        """Whether ``task`` may run now (a slot taken, or no limits); else it waits here."""
        if not task.definition.limits.limited:
            return True
        queued = any(other.definition.name == task.definition.name for other in self.waiting)  # keep their order
        if queued or not self._take(task, set()):
            task.deadline = None  # waiting for a slot does not count against the attempt's timeout
            self.waiting.append(task)
            self._retry_later()
            return False
        return True

    def _take(self, task: AttemptTask, refused: set[Any]) -> bool:
        limits = task.definition.limits
        try:
            key = attempt_key(task)
        except Exception:  # the user's key function failed: run unkeyed rather than never
            logger.exception("concurrency_key failed activity=%s workflow=%s", task.definition.name, task.workflow_id)
            key = None
        name = task.definition.name
        if name in refused or (name, key) in refused:
            return False
        request = SlotRequest(
            name, key, task.workflow_id, task.run_id, task.seq, task.attempt, task.epoch,
            limits.concurrency, limits.rate, limits.per_key,
        )  # fmt: skip
        try:
            slot, why = take_slot(self.engine_id, request, self.using)
        except DatabaseError as exc:
            logger.warning("activity slot not taken activity=%s error=%s", name, exc)
            slot, why = None, "concurrency"
        if slot is None:
            refused.add((name, key) if why == "key" else name)
            return False
        self.held[id(task)] = (task, slot)
        return True

    def retry(self, submit: Callable[[AttemptTask], None]) -> None:
        """Try the waiting attempts again (in order; after a refusal, no later attempt of that activity,
        or of that key, is tried this time) and hand those that got a slot to ``submit``."""
        if not self.waiting or time.monotonic() < self._next_try:
            return
        self._next_try = time.monotonic() + RETRY
        refused: set[Any] = set()
        still: list[AttemptTask] = []
        for task in self.waiting:
            if task.control.stop_reason is not None:
                continue  # the engine no longer waits for it
            if self._take(task, refused):
                submit(task)
            else:
                still.append(task)
        self.waiting = still
        if still:
            self._retry_later()

    def release_finished(self, running: Iterable[AttemptTask]) -> None:
        """Release the slots of attempts no longer running in the executor (``running``: those that are)."""
        alive = {id(task) for task in running}
        done = {key: self.held[key] for key in self.held if key not in alive}
        if not done:
            return
        for key in done:
            del self.held[key]
        slots = [slot for _, slot in done.values()]
        try:
            held = release_slots(slots, self.using)
        except DatabaseError as exc:  # they stop counting when the claim moves; try again next time
            logger.warning("activity slots not released slots=%s error=%s", slots, exc)
            self.held.update(done)
            return
        if held:  # their rows are held by another transaction (a user's): released on a later poll
            self.held.update({key: entry for key, entry in done.items() if entry[1] in held})

    def _retry_later(self) -> None:
        if self._timer is not None and self._timer.is_alive():
            return
        self._timer = threading.Timer(RETRY, self.wake)
        self._timer.daemon = True
        self._timer.start()

    @property
    def busy(self) -> bool:
        """Whether the loop must keep polling (attempts wait for a slot, or slots wait for release)."""
        return bool(self.waiting)
