"""A start's queue options (``start(queue=, priority=, concurrency_key=)``), checked against
WEFT["QUEUES"] before anything is written."""

from __future__ import annotations

from typing import Any

from . import conf
from .exceptions import InvalidArgumentError, UnknownQueueError
from .flow import MAX_PRIORITY
from .registry import WorkflowDefinition
from .validation import validate_name


def queue_options(
    definition: WorkflowDefinition, queue: Any, priority: Any, concurrency_key: Any, *, delayed: bool
) -> tuple[str | None, int, str | None]:
    """(queue, priority, concurrency key) of a start: ``queue`` or else the workflow's own.

    Args:
        definition: the workflow; ``queue``, ``priority``, ``concurrency_key``: as given to start().
        delayed: the start has start_after / start_at.

    Raises:
        UnknownQueueError: the queue is not in WEFT["QUEUES"].
        InvalidArgumentError: a bad priority or key, either without a queue, a priority in a queue
            without priorities, or a delayed start in a queue.
        ConfigurationError: WEFT["QUEUES"] itself is broken.
    """
    name = queue if queue is not None else definition.queue
    if name is None:
        if priority is not None or concurrency_key is not None:
            raise InvalidArgumentError(
                "priority and concurrency_key apply to a run in a queue: pass queue=... as well, or give the "
                "workflow one with @weft.workflow(queue=...)."
            )
        return None, 0, None
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"queue must be the name of a queue in WEFT['QUEUES'] (got {name!r}).")
    config = conf.queues().get(name)
    if config is None:
        known = ", ".join(sorted(conf.queues())) or "none"
        raise UnknownQueueError(
            f'Queue "{name}" is not in WEFT["QUEUES"] (defined: {known}). Add it, e.g. WEFT["QUEUES"] = '
            f'{{"{name}": {{"concurrency": 10}}}}, or fix the name.'
        )
    if delayed:
        raise InvalidArgumentError(
            f'A run in queue "{name}" cannot have start_after / start_at: a queued run starts when the queue '
            "admits it. Start it without the delay, or without the queue."
        )
    chosen = 0
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
            raise InvalidArgumentError(f"priority must be a whole number from 0 to {MAX_PRIORITY} (got {priority!r}).")
        if priority and not config.priorities:
            raise InvalidArgumentError(
                f'Queue "{name}" does not take priorities: set "priorities": True in WEFT["QUEUES"]["{name}"], '
                "or start without priority=."
            )
        chosen = priority
    if concurrency_key is not None:
        validate_name(concurrency_key, "concurrency_key")
    return name, chosen, concurrency_key
