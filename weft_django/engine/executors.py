"""Which executor runs an attempt: the activity's ``executor=`` option, else WEFT["ACTIVITY_EXECUTOR"].

"threads" is the engine's own pool (engine/activities.py). "celery" sends the attempt to Celery workers
(weft_django/engine/celery_executor.py); Celery is imported only when an attempt needs it, so projects without
the extra never load it. A Celery attempt needs a per-attempt timeout: a worker that dies keeps its
message invisible until the broker's visibility timeout (an hour by default on Redis), so only the
attempt timeout lets the engine retry in time. An attempt that cannot be sent for a configuration
reason fails at once, not retryable, with a ConfigurationError that says what to set.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from datetime import datetime

from ..conf import WeftSettings
from ..exceptions import ConfigurationError
from ..registry import ActivityDefinition, registry
from .activities import AttemptOutcome, AttemptTask, Executor, ThreadExecutor
from .driver import describe_exception
from .limits import ActivityLimiter

logger = logging.getLogger(__name__)
CELERY = "celery"


def untimed_celery_message(definition: ActivityDefinition) -> str:
    return (
        f'Activity "{definition.name}" runs on Celery workers and needs a per-attempt timeout: set '
        f"@weft.activity(timeout=...) or ctx.run({definition.fn.__name__}.options(timeout=...), ...). A worker "
        "that dies keeps its message invisible until the broker's visibility timeout (an hour by default on "
        "Redis), so only the attempt timeout lets the engine retry in time."
    )


class ActivityExecutors:
    """The engine's executor: routes each attempt to the thread pool or to Celery."""

    def __init__(
        self,
        engine_id: str,
        concurrency: int,
        on_done: Callable[[], None],
        commit_atomic: Callable[[AttemptTask, str], datetime | None],
        using: str,
        settings: WeftSettings,
    ) -> None:
        self.threads = ThreadExecutor(concurrency, on_done, commit_atomic, using)
        self.outcomes: queue.SimpleQueue[AttemptOutcome] = self.threads.outcomes
        self._on_done = on_done
        self._engine_id = engine_id
        self._using = using
        self._settings = settings
        self._celery: Executor | None = None
        self.limiter = ActivityLimiter(engine_id, using, on_done)  # activity limits across engines (limits.py)
        self.default = settings.activity_executor
        if self.default == CELERY:
            self._remote()  # refuse to start without Celery or a broker, not at the first dispatch
        for definition in registry.activities.values():
            if self.uses_celery(definition) and definition.timeout is None:
                logger.error("%s", untimed_celery_message(definition))

    def uses_celery(self, definition: ActivityDefinition) -> bool:
        return (definition.executor or self.default) == CELERY

    def submit(self, task: AttemptTask) -> None:
        if self.limiter.admit(task):  # else it waits for a slot (poll() tries again)
            self._submit(task)

    def _submit(self, task: AttemptTask) -> None:
        if not self.uses_celery(task.definition):
            self.threads.submit(task)
            return
        try:
            if task.definition.timeout is None:
                raise ConfigurationError(untimed_celery_message(task.definition))
            remote = self._remote()
        except ConfigurationError as exc:
            logger.error("activity not sent workflow=%s seq=%s error=%s", task.workflow_id, task.seq, exc)
            self.outcomes.put(AttemptOutcome(task, ok=False, error=describe_exception(exc), retryable=False))
            self._on_done()
            return
        remote.submit(task)

    def _remote(self) -> Executor:
        if self._celery is None:
            try:
                from .celery_executor import CeleryExecutor  # optional: the celery extra
            except ImportError as exc:
                raise ConfigurationError(
                    f'Activities with executor "celery" need Celery in the engine process ({exc}): '
                    "pip install 'weft-django[celery]'."
                ) from exc
            self._celery = CeleryExecutor(
                self._engine_id, self.outcomes, self._using, self._settings.poll_interval.total_seconds()
            )
        return self._celery

    def take_outcomes(self) -> list[AttemptOutcome]:
        """The outcomes reported since the last call, in order. Their attempts' activity slots are
        released first: an outcome's step (and maybe its run's end) is committed later in this pass, so
        a slot never outlives the run it served (an executor forgets an attempt before reporting it)."""
        outcomes = []
        while True:
            try:
                outcomes.append(self.outcomes.get_nowait())
            except queue.Empty:
                break
        if outcomes and self.limiter.held:
            self.limiter.release_finished(self.running)
        return outcomes

    @property
    def polls(self) -> bool:
        """Whether outcomes arrive through the database (remote workers), found only by ``poll``, or
        attempts wait for an activity slot, or a slot waits to be released."""
        return self._celery is not None or self.limiter.busy or self._releasable

    @property
    def _releasable(self) -> bool:
        """Whether a slot is held for an attempt no longer running (one stopped before it ran reports
        no outcome): the next pass releases it."""
        if not self.limiter.held:
            return False
        running = {id(task) for task in self.running}
        return any(key not in running for key in self.limiter.held)

    @property
    def busy(self) -> bool:
        """Whether an attempt is running or waiting for an activity slot, or a slot waits to be released
        (the test kit's idle check: a run may end before its last slot is released)."""
        return bool(self.running) or self.limiter.busy or self._releasable

    @property
    def saturated(self) -> bool:
        """Whether the engine's own threads have as many attempts waiting as they run: workflows claimed
        now would only wait behind them (remote executors keep their own queues and do not count)."""
        return self.threads.waiting >= self.threads.concurrency

    @property
    def awaited(self) -> bool:
        """Whether a running attempt's outcome may still be recorded: one not asked to stop. An attempt
        asked to stop (timed out, its workflow ended or left this engine) is dropped whatever it
        returns, so the drain at shutdown does not wait for it."""
        return any(task.control.stop_reason is None for task in self.running)

    @property
    def running(self) -> list[AttemptTask]:
        """Attempts handed to an executor and not finished (not those waiting for a slot)."""
        remote = self._celery.running if self._celery is not None else []
        return self.threads.running + remote

    def poll(self, notified: set[str]) -> None:
        """Outcomes that workers committed to the database (and remote attempts past their timeout);
        activity slots released and taken."""
        if self._celery is not None:
            self._celery.poll(notified)
        if self.limiter.held:
            self.limiter.release_finished(self.running)
        self.limiter.retry(self._submit)

    def shutdown(self, wait_seconds: float) -> None:
        self.threads.shutdown(wait_seconds)
        if self._celery is not None:
            self._celery.shutdown(wait_seconds)
