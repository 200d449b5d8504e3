"""@workflow and @activity: definitions and their lookup by name (and version)."""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, overload

from .codec import is_storable
from .durations import MAX_DURATION, InvalidDuration, to_nonnegative_timedelta
from .exceptions import WorkflowDefinitionError, WorkflowNotRegisteredError
from .flow import NO_LIMITS, ActivityLimits, FlowValueError, parse_rate, positive_limit
from .search_attributes import declare
from .starter import RunHandle, starter

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_INITIAL_BACKOFF = timedelta(seconds=1)
DEFAULT_BACKOFF_MULTIPLIER = 2.0
DEFAULT_MAX_BACKOFF = timedelta(seconds=30)
MAX_BACKOFF_MULTIPLIER = 1000.0  # beyond it the second retry would already wait out any max_backoff


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How an activity is retried. Unset fields take weft's defaults (3 attempts, 1 s, x2, 30 s)."""

    max_attempts: int | None = None
    initial_backoff: Any = None
    backoff_multiplier: float | None = None
    max_backoff: Any = None
    non_retryable: Iterable[str] = ()

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1
        ):
            raise WorkflowDefinitionError(
                f"RetryPolicy.max_attempts must be a whole number >= 1 (got {self.max_attempts!r})."
            )
        multiplier = self.backoff_multiplier
        if multiplier is not None and (
            isinstance(multiplier, bool)
            or not isinstance(multiplier, int | float)
            or not math.isfinite(multiplier)  # NaN passes both comparisons below
            or not 1 <= multiplier <= MAX_BACKOFF_MULTIPLIER
        ):
            raise WorkflowDefinitionError(
                f"RetryPolicy.backoff_multiplier must be a number >= 1 and <= {MAX_BACKOFF_MULTIPLIER:g}, not NaN "
                f"(got {multiplier!r}); use max_backoff to cap how long a retry waits."
            )
        for name in ("initial_backoff", "max_backoff"):
            value = getattr(self, name)
            if value is not None:
                _duration(value, f"RetryPolicy.{name}")
        if isinstance(self.non_retryable, str):
            raise WorkflowDefinitionError("RetryPolicy.non_retryable must be a list of exception names, not a string.")
        object.__setattr__(self, "non_retryable", tuple(self.non_retryable))

    @property
    def attempts(self) -> int:
        return self.max_attempts or DEFAULT_MAX_ATTEMPTS

    def backoff(self, failed_attempt: int) -> timedelta:
        """The wait after failed attempt ``failed_attempt`` (1-based)."""
        initial = _duration(self.initial_backoff, "initial_backoff") if self.initial_backoff is not None else None
        cap = _duration(self.max_backoff, "max_backoff") if self.max_backoff is not None else None
        initial = initial if initial is not None else DEFAULT_INITIAL_BACKOFF
        cap = cap if cap is not None else DEFAULT_MAX_BACKOFF
        multiplier = self.backoff_multiplier if self.backoff_multiplier is not None else DEFAULT_BACKOFF_MULTIPLIER
        cap = min(cap, MAX_DURATION)
        if not initial:  # 0 * multiplier**(k-1) is 0 for every k (an overflowing power is no reason to cap it)
            return timedelta(0)
        try:  # a float power: an int one of a large max_attempts would take minutes, then not fit a timedelta
            seconds = initial.total_seconds() * float(multiplier) ** max(failed_attempt - 1, 0)
        except OverflowError:
            return cap
        if not math.isfinite(seconds) or seconds >= cap.total_seconds():
            return cap
        return min(timedelta(seconds=seconds), cap)

    def is_retryable(self, error: BaseException) -> bool:
        names = set(self.non_retryable)
        for klass in type(error).__mro__:
            if klass.__name__ in names or f"{klass.__module__}.{klass.__qualname__}" in names:
                return False
        return True


NO_RETRY = RetryPolicy(max_attempts=1)


def _duration(value: Any, name: str) -> timedelta:
    try:
        return to_nonnegative_timedelta(value, name)
    except InvalidDuration as exc:
        raise WorkflowDefinitionError(str(exc)) from None


def _origin(fn: Callable[..., Any]) -> tuple[str, str, int]:
    code = getattr(fn, "__code__", None)
    return (fn.__qualname__, getattr(code, "co_filename", ""), getattr(code, "co_firstlineno", 0))


@dataclasses.dataclass(frozen=True)
class ActivityDefinition:
    fn: Callable[..., Any]
    name: str
    retry: RetryPolicy
    timeout: timedelta | None = None
    schedule_to_close_timeout: timedelta | None = None
    atomic: bool = False
    executor: str | None = None
    queue: str | None = None  # the Celery queue (executor="celery"); workflow queues are WorkflowDefinition.queue
    limits: ActivityLimits = NO_LIMITS  # concurrency / rate / per-key limits across all engines
    local: bool = False  # runs on the engine's loop thread, no attempt record before it (docs/concepts.md)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling an activity directly just runs it (handy in tests)."""
        return self.fn(*args, **kwargs)

    def options(self, **overrides: Any) -> ActivityDefinition:
        """A copy with per-call options: ``ctx.run(charge.options(timeout="5s"), ...)``."""
        known = {"retry", "timeout", "schedule_to_close_timeout", "executor", "queue", "local", *LIMITS}
        unknown = set(overrides) - known
        if unknown:
            raise WorkflowDefinitionError(f"Unknown activity option(s): {', '.join(sorted(unknown))}.")
        limits = {key: overrides.pop(key) for key in LIMITS if key in overrides}
        changed = dataclasses.replace(self, **_activity_options(self.name, **overrides, _partial=True))
        if limits:
            changed = dataclasses.replace(changed, limits=_limits(self.name, self.limits, **limits))
        _check_local(changed)
        return changed


@dataclasses.dataclass(frozen=True)
class WorkflowDefinition:
    fn: Callable[..., Any]
    name: str
    version: str
    # Declared search attributes: name -> kind (weft_django.search_attributes), issue 19.
    attributes: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)
    queue: str | None = None  # its runs wait in this WEFT["QUEUES"] queue unless start(queue=) says otherwise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def start(self, *args: Any, **kwargs: Any) -> RunHandle:
        """Start a run with a generated id; every argument goes to the workflow (``weft.start``).

        Returns a WorkflowHandle. The shortcut calls the client's ``start``, which the client installs
        in weft_django/starter.py: the registry (which the client reads) never imports the client.
        """
        return starter()(self, args=args, kwargs=kwargs)


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.workflows: dict[tuple[str, str], WorkflowDefinition] = {}
        self.latest: dict[str, WorkflowDefinition] = {}
        self.activities: dict[str, ActivityDefinition] = {}

    def add_workflow(self, definition: WorkflowDefinition) -> WorkflowDefinition:
        key = (definition.name, definition.version)
        with self._lock:
            existing = self.workflows.get(key)
            if existing is not None:
                if _origin(existing.fn) == _origin(definition.fn):
                    return existing  # the same module imported twice
                raise WorkflowDefinitionError(
                    f'Workflow "{definition.name}" version "{definition.version}" is already registered by '
                    f"{existing.fn.__module__}.{existing.fn.__qualname__}; give this one another name or version."
                )
            self.workflows[key] = definition
            self.latest[definition.name] = definition
            return definition

    def add_activity(self, definition: ActivityDefinition) -> ActivityDefinition:
        with self._lock:
            existing = self.activities.get(definition.name)
            if existing is not None:
                if _origin(existing.fn) == _origin(definition.fn):
                    return existing
                raise WorkflowDefinitionError(
                    f'Activity "{definition.name}" is already registered by '
                    f"{existing.fn.__module__}.{existing.fn.__qualname__}; give this one another name."
                )
            self.activities[definition.name] = definition
            return definition

    def workflow(self, name: str, version: str | None = None) -> WorkflowDefinition:
        definition = self.latest.get(name) if version is None else self.workflows.get((name, version))
        if definition is None:
            known = ", ".join(sorted(self.latest)) or "none"
            wanted = f'"{name}"' + (f' version "{version}"' if version is not None else "")
            raise WorkflowNotRegisteredError(
                f"No workflow {wanted} is registered in this process (registered: {known}). Define it with "
                f"@weft.workflow in a module that is imported at start-up (an app's "
                f"workflows.py is autodiscovered)."
            )
        return definition

    def activity(self, name: str) -> ActivityDefinition:
        definition = self.activities.get(name)
        if definition is None:
            raise WorkflowNotRegisteredError(
                f'No activity "{name}" is registered in this process. Define it with @weft.activity in a '
                f"module that is imported at start-up."
            )
        return definition


registry = Registry()


def resolve_workflow(workflow: WorkflowDefinition | Callable[..., Any] | str) -> WorkflowDefinition:
    """The definition for a decorated function, a definition, or a registered name."""
    if isinstance(workflow, WorkflowDefinition):
        return workflow
    if isinstance(workflow, str):
        return registry.workflow(workflow)
    definition = getattr(workflow, "__weft_workflow__", None)
    if isinstance(definition, WorkflowDefinition):
        return definition
    raise WorkflowNotRegisteredError(
        f"{workflow!r} is not a workflow: decorate it with @weft.workflow or pass its registered name."
    )


def resolve_activity(activity: ActivityDefinition | Callable[..., Any] | str) -> ActivityDefinition:
    if isinstance(activity, ActivityDefinition):
        return activity
    if isinstance(activity, str):
        return registry.activity(activity)
    definition = getattr(activity, "__weft_activity__", None)
    if isinstance(definition, ActivityDefinition):
        return definition
    raise WorkflowNotRegisteredError(
        f"{activity!r} is not an activity: decorate it with @weft.activity or pass its registered name."
    )


def _check_name(kind: str, value: Any) -> str:
    """A workflow, activity or queue name: it is stored (a varchar(255) column, a NOTIFY payload), so
    a non-empty str of at most 255 characters with no NUL or unpaired surrogate."""
    if not isinstance(value, str) or not value.strip() or len(value) > 255 or not is_storable(value):
        raise WorkflowDefinitionError(
            f"{kind} name must be a non-empty string of at most 255 characters, without NUL or unpaired "
            f"surrogates (got {value!r:.300})."
        )
    return value


LIMITS = ("concurrency", "rate", "concurrency_key")


def _limits(name: str, base: ActivityLimits, **given: Any) -> ActivityLimits:
    """An activity's limits: ``concurrency`` (a whole number >= 1), ``rate`` ("10/s"), ``concurrency_key``
    (a callable of the activity's arguments returning a key or None, or a fixed key string)."""
    changes: dict[str, Any] = {}
    try:
        if given.get("concurrency") is not None:
            changes["concurrency"] = positive_limit(given["concurrency"], f"Activity {name!r} concurrency")
        if given.get("rate") is not None:
            changes["rate"] = parse_rate(given["rate"], f"Activity {name!r} rate")
    except FlowValueError as exc:
        raise WorkflowDefinitionError(str(exc)) from None
    key = given.get("concurrency_key")
    if key is not None:
        if not callable(key) and not (isinstance(key, str) and key and len(key) <= 255):
            raise WorkflowDefinitionError(
                f"Activity {name!r}: concurrency_key must be a callable of the activity's arguments returning a key "
                f"(or None), or a key string of 1-255 characters (got {key!r})."
            )
        changes["key"] = key
    return dataclasses.replace(base, **changes)


def _activity_options(name: str, _partial: bool = False, **options: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "retry" in options or not _partial:
        retry = options.get("retry")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise WorkflowDefinitionError(f"Activity {name!r}: retry must be a weft.RetryPolicy (got {retry!r}).")
        out["retry"] = retry or NO_RETRY
    for key in ("timeout", "schedule_to_close_timeout"):
        if key in options or not _partial:
            value = options.get(key)
            if value is not None:
                value = _duration(value, f"Activity {name!r} {key}")
                if value <= timedelta(0):
                    raise WorkflowDefinitionError(f"Activity {name!r}: {key} must be greater than zero.")
            out[key] = value
    if "executor" in options or not _partial:
        executor = options.get("executor")
        if executor not in (None, "threads", "celery"):
            raise WorkflowDefinitionError(
                f'Activity {name!r}: executor must be "threads" or "celery" (got {executor!r}).'
            )
        out["executor"] = executor
    if "queue" in options or not _partial:  # stored with each attempt sent (RemoteAttempt.queue)
        queue = options.get("queue")
        out["queue"] = None if queue is None else _check_name(f"Activity {name!r}: the Celery queue", queue)
    if "local" in options or not _partial:
        local = options.get("local", False)
        if not isinstance(local, bool):
            raise WorkflowDefinitionError(f"Activity {name!r}: local must be True or False (got {local!r}).")
        out["local"] = local
    return out


def _check_local(definition: ActivityDefinition) -> None:
    """A local activity runs in the engine's loop: not atomic (its own fenced transaction), not on Celery,
    and without activity limits (the limiter is on the executor dispatch path, which it skips)."""
    if definition.local and (definition.atomic or definition.executor == "celery"):
        other = "atomic=True" if definition.atomic else 'executor="celery"'
        raise WorkflowDefinitionError(
            f"Activity {definition.name!r}: local=True cannot be combined with {other}: a local activity runs in the "
            f"engine's process and its result is committed with the workflow's next commit. Drop one of them."
        )
    limits = definition.limits
    if definition.local and (limits.concurrency is not None or limits.rate is not None or limits.key is not None):
        pairs = (("concurrency", limits.concurrency), ("rate", limits.rate), ("concurrency_key", limits.key))
        given = [name for name, value in pairs if value is not None]
        raise WorkflowDefinitionError(
            f"Activity {definition.name!r}: local=True cannot be combined with {', '.join(given)}=: a local activity "
            f"runs in the engine's loop, outside the activity limiter, so its limits would not hold. Drop local=True "
            f"or the limits."
        )


@overload
def workflow(fn: Callable[..., Any], /) -> Callable[..., Any]: ...
@overload
def workflow(
    *,
    name: str | None = None,
    version: str = "1",
    attributes: Mapping[str, Any] | None = None,
    queue: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def workflow(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    version: str = "1",
    attributes: Mapping[str, Any] | None = None,
    queue: str | None = None,
) -> Any:
    """Register a generator function as a workflow. Works bare or with ``name=`` / ``version=`` /
    ``attributes=`` (the search attributes it may set: name -> str, int, float, bool, datetime or
    list[str]; see docs/visibility.md) / ``queue=`` (its runs wait in that WEFT["QUEUES"] queue;
    checked against the settings at start, docs/queues.md). Raises WorkflowDefinitionError for a bad
    definition."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            raise WorkflowDefinitionError(
                f"@weft.workflow needs a plain generator function, not `async def`: "
                f"{func.__module__}.{func.__qualname__} is async. Write it with `def` and `yield` each durable "
                f"operation instead of `await`ing it, e.g. `result = yield ctx.run(my_activity)`; put async code "
                f"in an activity (a plain function calling it with asgiref's async_to_sync)."
            )
        if not inspect.isgeneratorfunction(func):
            raise WorkflowDefinitionError(
                f"@weft.workflow needs a generator function: {func.__module__}.{func.__qualname__} has no "
                f"`yield`. Yield each durable operation, e.g. `result = yield ctx.run(my_activity)`."
            )
        if not isinstance(version, str) or not version or len(version) > 64:
            raise WorkflowDefinitionError(f"Workflow version must be a non-empty string (got {version!r}).")
        wf_name = _check_name("Workflow", name if name is not None else f"{func.__module__}.{func.__qualname__}")
        kinds = declare(attributes, wf_name)
        if queue is not None:
            _check_name("Queue", queue)
        definition = registry.add_workflow(WorkflowDefinition(func, wf_name, version, kinds, queue))
        func.__weft_workflow__ = definition  # type: ignore[attr-defined]
        func.start = definition.start  # type: ignore[attr-defined]
        return func

    return decorate(fn) if fn is not None else decorate


def activity(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: Any = None,
    schedule_to_close_timeout: Any = None,
    atomic: bool = False,
    executor: str | None = None,
    queue: str | None = None,
    local: bool = False,
    concurrency: int | None = None,
    rate: Any = None,
    concurrency_key: Any = None,
) -> Any:
    """Register a function as an activity. Works bare or with options.

    ``concurrency``, ``rate`` ("10/s") and ``concurrency_key`` (a callable of the arguments giving a
    key: one attempt per key at a time) limit its attempts across all engines (docs/queues.md).

    ``local=True``: a local activity (docs/concepts.md): it runs on the engine's loop thread with no
    attempt record before it, and its result is committed with the workflow's next commit (at least
    once). Raises WorkflowDefinitionError combined with ``atomic=True`` or ``executor="celery"``."""

    def decorate(func: Callable[..., Any]) -> ActivityDefinition:
        if inspect.isgeneratorfunction(func) or inspect.iscoroutinefunction(func):
            raise WorkflowDefinitionError(
                f"@weft.activity needs a plain function: {func.__module__}.{func.__qualname__} is a generator "
                f"or coroutine function."
            )
        act_name = _check_name("Activity", name if name is not None else f"{func.__module__}.{func.__qualname__}")
        options = _activity_options(
            act_name,
            retry=retry,
            timeout=timeout,
            schedule_to_close_timeout=schedule_to_close_timeout,
            executor=executor,
            queue=queue,
            local=local,
        )
        limits = _limits(
            act_name, ActivityLimits(), concurrency=concurrency, rate=rate, concurrency_key=concurrency_key
        )
        definition = ActivityDefinition(func, act_name, atomic=bool(atomic), limits=limits, **options)
        _check_local(definition)
        definition = registry.add_activity(definition)
        func.__weft_activity__ = definition  # type: ignore[attr-defined]
        return definition

    return decorate(fn) if fn is not None else decorate


def declared_attributes() -> dict[str, set[str]]:
    """Every search attribute some registered workflow declares: name -> its kinds (a filter checks
    its names and values against them)."""
    found: dict[str, set[str]] = {}
    for definition in list(registry.workflows.values()):
        for name, kind in definition.attributes.items():
            found.setdefault(name, set()).add(kind)
    return found


def autodiscover() -> None:
    """Import ``<app>.<AUTODISCOVER_MODULE>`` for every installed app."""
    from django.utils.module_loading import autodiscover_modules

    from .conf import autodiscover_module

    autodiscover_modules(autodiscover_module())


__all__ = ["ActivityDefinition", "RetryPolicy", "WorkflowDefinition", "activity", "registry", "workflow"]
