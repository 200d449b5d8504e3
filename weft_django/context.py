"""WorkflowContext: what workflow code receives. It builds operation descriptors (no I/O) and keeps
the query, update and cancel handlers the owning engine calls between turns."""

from __future__ import annotations

import functools
import logging
import random
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from . import deterministic
from .codec import encode_payload, is_storable
from .durations import InvalidDuration, to_nonnegative_timedelta
from .exceptions import WorkflowDefinitionError
from .operations import (
    All,
    Inert,
    Memo,
    Operation,
    Race,
    RunActivity,
    Sleep,
    StartChild,
    WaitForSignal,
    WaitForUpdate,
    WaitUntil,
)
from .registry import resolve_activity
from .search_attributes import check_values
from .validation import validate_workflow_id

logger = logging.getLogger("weft_django.workflow")
_BRANCHABLE = (RunActivity, Sleep, WaitForSignal, StartChild)


class _ReplayAwareLogger(logging.LoggerAdapter):
    """ctx.log: silent while replaying, so a recovered run does not log its history again."""

    def __init__(self, ctx: WorkflowContext) -> None:
        super().__init__(logger, {})
        self._ctx = ctx

    def isEnabledFor(self, level: int) -> bool:
        return not self._ctx.is_replaying and super().isEnabledFor(level)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{self._ctx.workflow_id}] {msg}", kwargs


class WorkflowContext:
    """The first argument of every workflow function."""

    def __init__(
        self,
        *,
        workflow_id: str,
        run_id: str,
        workflow_type: str,
        started_at: datetime | None,
        epoch: int,
    ) -> None:
        self.workflow_id = workflow_id
        self.run_id = run_id
        self.workflow_type = workflow_type
        self.started_at = started_at
        self.epoch = epoch
        self.is_replaying = False
        self.detached = False
        self.cancelled = False  # set before the on_cancel handlers run
        # What runs now on each thread that must change nothing ("a query handler", "an update
        # validator"), by thread id (see ``read_only``); made here, not by the first reader: two threads
        # that first read at once would each make one, and one reader's mode would be lost.
        self._readers: dict[int, str] = {}
        self.query_handlers: dict[str, Callable[..., Any]] = {}
        self.exposed: dict[str, Callable[[], Any]] = {}
        self.update_handlers: dict[str, tuple[Callable[[Any], Any], Any]] = {}
        self.cancel_handlers: list[Callable[[], Any]] = []
        # Search attributes (issue 19): the declared kinds (set by the engine from the definition),
        # the current values, and the checked calls not yet handed to a fenced commit.
        self.attribute_kinds: Mapping[str, str] = {}
        self.attributes: dict[str, Any] = {}
        self.pending_attributes: list[dict[str, Any]] = []
        self.history: deterministic.RunHistory | None = None  # set by the driver that replays this run
        # A fork's values below its fork point are its source's (weft.fork); set by the driver's start.
        self.lineage = deterministic.Lineage()
        self._random: tuple[int, random.Random] | None = None

    @functools.cached_property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger (``ctx.log.info(...)``) silent while the run replays its history, so a recovered
        run does not log again what it logged before; its lines start with the workflow id. Made on
        first use (most runs never log)."""
        return _ReplayAwareLogger(self)

    # -- safe deploys and deterministic values (weft_django/deterministic.py) -------------------
    def patched(self, change_id: str) -> bool:
        """Whether this run takes the new branch of a code change: ``if ctx.patched("fee-v2"): ...``.

        A run that reaches the call for the first time gets True and a ``patch`` marker in its history
        (durable with the next fenced commit, in order); a run recorded before the change (something
        recorded at or after this point, no marker) gets False. The answer is fixed per run and id.

        Args:
            change_id: names the change (a non-empty string, at most 255 characters).

        Raises:
            WorkflowDefinitionError: a bad change id, or called outside the workflow function's code.
        """
        deterministic.check_patch_id(change_id, "ctx.patched")
        return self._history("ctx.patched").patched(change_id, deprecated=False)

    def deprecate_patch(self, change_id: str) -> None:
        """The cleanup step of a change once no run needs its old branch: the code keeps only the new
        branch, and histories with or without the ``patched`` marker both replay.

        Args:
            change_id: the id ``ctx.patched`` took.

        Raises:
            WorkflowDefinitionError: a bad change id, or called outside the workflow function's code.
        """
        deterministic.check_patch_id(change_id, "ctx.deprecate_patch")
        self._history("ctx.deprecate_patch").patched(change_id, deprecated=True)

    def now(self) -> datetime:
        """Workflow time (aware, UTC): the latest durable time the code has observed, the completion
        of the last step fed to it (its start before any). The same value on replay; it does not move
        between two yields. Not for measuring durations inside one turn."""
        history = self.history
        if history is None:
            if self.started_at is None:
                raise WorkflowDefinitionError("ctx.now() is only available inside a running workflow.")
            return self.started_at
        return history.now()

    def random(self) -> random.Random:
        """A ``random.Random`` seeded from the run id and the current step position: replay draws the
        same numbers (a fork, below its fork point, its source's). Not for secrets."""
        position = self._history("ctx.random").position
        if self._random is None or self._random[0] != position:
            seed = self.lineage.seed(self.run_id, position)
            self._random = (position, deterministic.seeded_random(seed, position))
        return self._random[1]

    def uuid4(self) -> uuid.UUID:
        """A version-4 UUID drawn from ``ctx.random()`` (the same on replay; not for secrets)."""
        return deterministic.uuid4_from(self.random())

    def _history(self, call: str) -> deterministic.RunHistory:
        history = self.history
        if history is None or not history.in_code():
            raise WorkflowDefinitionError(
                f"{call} may only be called from the workflow function's own code while it runs (not from a "
                "query, update or cancel handler, nor outside a workflow)."
            )
        return history

    # -- operations -------------------------------------------------------------------------
    def run(self, activity: Any, /, *args: Any, **kwargs: Any) -> Operation:
        """Run an activity: ``result = yield ctx.run(charge_card, order_id, "12.00")``."""
        if self.detached:
            return Inert()
        definition = resolve_activity(activity)
        text = encode_payload({"args": list(args), "kwargs": kwargs}, path="activity input")
        return RunActivity(definition, text)

    def sleep(self, duration: Any) -> Operation:
        """A durable timer: ``yield ctx.sleep("5m")``."""
        if self.detached:
            return Inert()
        return Sleep(_duration(duration, "ctx.sleep duration"))

    def wait_for_signal(self, name: str, *, timeout: Any = None) -> Operation:
        """Wait for a signal; its payload is the result. WaitTimeoutError after ``timeout``."""
        if self.detached:
            return Inert()
        _check_name("signal", name)
        return WaitForSignal(name, None if timeout is None else _duration(timeout, "wait_for_signal timeout"))

    def wait_for_update(self, name: str) -> Operation:
        if self.detached:
            return Inert()
        _check_name("update", name)
        if name in self.update_handlers:
            raise WorkflowDefinitionError(
                f'Update "{name}" has an on_update handler; an update name is either handled or waited for.'
            )
        return WaitForUpdate(name)

    def wait_until(self, predicate: Callable[[], Any], *, timeout: Any = None) -> Operation:
        if self.detached:
            return Inert()
        if not callable(predicate):
            raise WorkflowDefinitionError("ctx.wait_until needs a callable predicate.")
        return WaitUntil(predicate, None if timeout is None else _duration(timeout, "wait_until timeout"))

    def memo(self, key: str, compute: Callable[[], Any]) -> Operation:
        """Compute a value once and record it: ``token = yield ctx.memo("token", make_token)``."""
        if self.detached:
            return Inert()
        _check_name("memo key", key)
        if not callable(compute):
            raise WorkflowDefinitionError("ctx.memo needs a callable that computes the value.")
        return Memo(key, compute)

    def all(self, operations: Sequence[Operation]) -> Operation:
        """Run operations in parallel; the result is their results in order."""
        if self.detached:
            return Inert()
        return All(_branches("ctx.all", operations))

    def race(self, operations: Sequence[Operation]) -> Operation:
        """The first operation to settle wins: the result is ``(index, value)``."""
        if self.detached:
            return Inert()
        return Race(_branches("ctx.race", operations))

    def start_child(
        self,
        workflow: Any,
        *,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        id: str | None = None,
        parent_close_policy: str = "terminate",
        queue: str | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
    ) -> Operation:
        """Start a child workflow and wait for its result: ``shipped = yield ctx.start_child("orders.ship",
        args=[order_id])``. A child that fails, is cancelled or times out raises ChildWorkflowError.

        Args:
            workflow: the child's workflow (its name or function); ``args``, ``kwargs``: its input.
            id: the child's workflow id (default: derived from this run and the step's position).
            parent_close_policy: what this run's end does to a child still running: "terminate",
                "request_cancel" or "abandon".
            queue, priority, concurrency_key: as for ``weft.start``: a child of a workflow declared
                with ``@weft.workflow(queue=...)`` (or given ``queue=``) waits in that queue, pending
                until an engine admits it under the queue's limits. The parent keeps its own slot while
                it waits: give children a queue of their own (in the parent's queue they can wait
                forever once parents fill it).

        Raises:
            WorkflowDefinitionError: a bad parent_close_policy.
            InvalidWorkflowIdError: a bad child id.
            UnknownQueueError, InvalidArgumentError: a bad queue, priority or key.
            PayloadNotSerializableError, PayloadSizeExceededError: the input cannot be stored.
        """
        if self.detached:
            return Inert()
        from .queueing import queue_options
        from .registry import resolve_workflow

        definition = resolve_workflow(workflow)
        if parent_close_policy not in ("terminate", "request_cancel", "abandon"):
            raise WorkflowDefinitionError(
                f'parent_close_policy must be "terminate", "request_cancel" or "abandon" (got {parent_close_policy!r}).'
            )
        child_id = None if id is None else validate_workflow_id(id, "child id")
        text = encode_payload({"args": list(args), "kwargs": dict(kwargs or {})}, path="child input")
        chosen, rank, key = queue_options(definition, queue, priority, concurrency_key, delayed=False)
        return StartChild(definition.name, definition.version, text, child_id, parent_close_policy, chosen, rank, key)

    def continue_as_new(self, *args: Any, **kwargs: Any) -> Operation:
        """End this run and start a fresh run of the same workflow id with this input and an empty
        history, in one fenced commit: ``yield ctx.continue_as_new(state)`` (or ``return`` it). The new
        run runs the latest registered version; unconsumed signals and admitted updates are carried
        over; the parent link and schedule are kept.

        Args:
            args, kwargs: the new run's input (codec-serialisable).

        Raises:
            PayloadNotSerializableError, PayloadSizeExceededError: the input cannot be stored.
            WorkflowTerminalError: the run was cancelled or has ended (a cancel handler, a finally).
        """
        from .exceptions import WorkflowTerminalError
        from .operations import ContinueAsNew
        from .registry import registry

        if self.detached or self.cancelled:
            raise WorkflowTerminalError(
                f"Workflow {self.workflow_id!r} was cancelled or has ended: it cannot continue as new. Start a new "
                "run with weft.start(..., id=...) instead."
            )
        text = encode_payload({"args": list(args), "kwargs": kwargs}, path="continue_as_new input")
        latest = registry.latest.get(self.workflow_type)
        return ContinueAsNew(text, latest.version if latest is not None else "1")

    # -- handlers ---------------------------------------------------------------------------
    def expose(self, **accessors: Callable[[], Any]) -> None:
        """Accessors answered by ``handle.query(name)``; they must only read (as ``on_query`` handlers)."""
        for name, accessor in accessors.items():
            if not callable(accessor):
                raise WorkflowDefinitionError(f"ctx.expose({name}=...) needs a callable.")
            self.exposed[name] = accessor

    def on_query(self, name: str, handler: Callable[..., Any]) -> None:
        """Answer ``handle.query(name, arg)`` with ``handler()`` (or ``handler(arg)``) on the live context.
        It must change nothing: it is not recorded and replay does not run it, so state it changed is
        gone after a replay (set_attributes and respond() raise here; plain variables cannot be guarded).
        Change state with ``on_update``."""
        _check_name("query", name)
        if name == "activity_progress":
            raise WorkflowDefinitionError('"activity_progress" is a built-in query; choose another name.')
        self.query_handlers[name] = handler

    def on_update(self, name: str, handler: Callable[[Any], Any], *, validator: Any = None) -> None:
        """Handle update ``name``: ``handler(payload)`` runs on the owning engine between turns (a plain
        function: no yield, no I/O) and its return value answers the caller. ``validator`` runs first:
        a callable (None / "" / [] accept; a string, a list of strings or of {"message", "path"}, or a
        raised django ValidationError reject), a Django Form class or a pydantic model class."""
        _check_name("update", name)
        if not callable(handler):
            raise WorkflowDefinitionError(f'ctx.on_update("{name}", ...) needs a callable handler.')
        if validator is not None and not callable(validator):
            raise WorkflowDefinitionError(
                f'ctx.on_update("{name}", ..., validator=...) takes a callable, a Django Form class or a pydantic '
                f"model class (got {validator!r})."
            )
        self.update_handlers[name] = (handler, validator)

    def on_cancel(self, handler: Callable[[], Any]) -> None:
        self.cancel_handlers.append(handler)

    # -- search attributes --------------------------------------------------------------------
    @property
    def read_only(self) -> str | None:
        """What runs now on this thread that must change nothing ("a query handler", "an update
        validator"), or None. Per thread, not per context: a handler run on another thread (a test
        calling ``Engine.answer_query`` beside the engine's loop) makes neither the workflow's own turn
        read-only nor lets its own writes through when another reader leaves first."""
        readers = self._readers
        return readers.get(threading.get_ident()) if readers else None

    @contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """While ``what`` runs on this thread (a query handler, an update validator: neither is recorded
        nor replayed), the calls that change the run durably raise WorkflowDefinitionError
        (``set_attributes``, a wait_for_update's ``respond()``)."""
        readers, thread = self._readers, threading.get_ident()
        previous = readers.get(thread)
        readers[thread] = what
        try:
            yield
        finally:
            if previous is None:
                readers.pop(thread, None)
            else:
                readers[thread] = previous

    def set_attributes(self, values: Mapping[str, Any] | None = None, /, **named: Any) -> None:
        """Set search attributes of this run: ``ctx.set_attributes(customer="acme", amount=12.5)``
        (or a dict). A value None clears the attribute. They become durable with the workflow's next
        fenced commit, in the order set (the last value of a name wins), and are what
        ``weft.list_workflows(attributes=...)`` filters on. Not an operation: nothing to yield. Replay
        sets them again (the same values: the rewrite is harmless, and a forked run gets them).

        Args:
            values, named: attribute name -> value of its declared type (``@weft.workflow(attributes=)``).

        Raises:
            InvalidSearchAttributeError: a name is not declared on this workflow or a value has another
                type; raised in the workflow code (uncaught, it fails the run) and nothing is queued.
            WorkflowDefinitionError: called from a query handler or an update validator (they change
                nothing: neither is recorded, so replay would not set them again).
        """
        if self.detached:
            return
        if self.read_only is not None:
            raise WorkflowDefinitionError(
                f"ctx.set_attributes may not be called from {self.read_only}: it must change nothing (it is not "
                "recorded, so replay would not set them again). Set attributes in the workflow code or an update "
                "handler."
            )
        merged = {**(values or {}), **named}
        checked = check_values(self.attribute_kinds, merged, f'Workflow "{self.workflow_type}"')
        for name, value in checked.items():
            if value is None:
                self.attributes.pop(name, None)
            else:
                self.attributes[name] = list(value[1]) if value[0] == "keywords" else value[1]
        if checked:
            self.pending_attributes.append(checked)


def _duration(value: Any, name: str) -> Any:
    try:
        return to_nonnegative_timedelta(value, name)
    except InvalidDuration as exc:
        raise WorkflowDefinitionError(str(exc)) from None


def _check_name(kind: str, name: Any) -> None:
    """A name workflow code gives (a signal, memo, query or update name): stored as a step's name."""
    if not isinstance(name, str) or not name or len(name) > 255 or not is_storable(name):
        raise WorkflowDefinitionError(
            f"The {kind} name must be a non-empty string of at most 255 characters, without NUL or unpaired surrogates."
        )


def _branches(where: str, operations: Sequence[Operation]) -> tuple[Operation, ...]:
    branches = tuple(operations)
    if not branches:
        raise WorkflowDefinitionError(f"{where} needs at least one operation.")
    for op in branches:
        if op.kind == "continue_as_new":
            raise WorkflowDefinitionError(
                f"{where}: ctx.continue_as_new ends the run, it is not a branch; yield it on its own after the "
                f"{where}(...) settles."
            )
        if isinstance(op, WaitUntil | WaitForUpdate):
            raise WorkflowDefinitionError(f"{where}: wait_until and wait_for_update are not allowed inside all/race.")
        if not isinstance(op, _BRANCHABLE):
            raise WorkflowDefinitionError(
                f"{where} takes ctx.run, ctx.sleep, ctx.wait_for_signal or ctx.start_child operations (got {op!r})."
            )
    return branches
