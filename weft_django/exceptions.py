"""The WeftError hierarchy. Every message says what to do about it.

Every class here is importable from ``weft_django`` (``from weft_django import WorkflowFailedError``)
and listed in docs/errors.md. The tree::

    WeftError
    ├── ConfigurationError (also ImproperlyConfigured)      settings.WEFT is invalid
    ├── WorkflowDefinitionError (also TypeError)            a @workflow / @activity definition is invalid
    ├── InvalidArgumentError (also ValueError)              an argument to the API is invalid
    │   ├── InvalidWorkflowIdError
    │   ├── InvalidScheduleError
    │   │   └── UnusableScheduleError                       a stored schedule row cannot be used (odd row)
    │   ├── InvalidSearchAttributeError, InvalidFilterError, InvalidForkError   visibility (issue 19)
    │   └── UnknownQueueError                               a start names a queue WEFT["QUEUES"] lacks
    ├── BulkCountChangedError                               a bulk operation's confirmation count is stale
    ├── WorkflowNotRegisteredError, VersionMismatchError    the code for a run is not in this process
    ├── WorkflowAlreadyExistsError, IdempotencyKeyPurgedError   starting
    ├── WorkflowNotFoundError, ScheduleNotFoundError (also LookupError)
    ├── WorkflowTerminalError, WorkflowStateError           a transition the run's status does not allow
    ├── WorkflowFailedError, WorkflowCancelledError, WorkflowTimedOutError   how a run ended (result())
    ├── WaitTimeoutError                                    a wait ran past its timeout
    │   └── ResultTimeoutError (also TimeoutError)          result(timeout=) before the run ended
    ├── ActivityError, ActivityTimeoutError, ActivityCancelledError, ChildWorkflowError   inside workflows
    ├── QueryNotFoundError, QueryFailedError, QueryTimeoutError
    ├── UpdateValidationError, UpdateFailedError, UpdateTimeoutError
    ├── PayloadSizeExceededError, PayloadNotSerializableError, CorruptPayloadError (also ValueError)
    ├── NonDeterminismError, EngineInternalError            a run that cannot go on (stuck, shown in the admin)
    └── WorkflowNotLocallyOwnedError, WorkflowClaimUnavailableError, OwnershipModeMismatchError,
        EngineLeaseAcquisitionTimeoutError                  ownership
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured


class WeftError(Exception):
    """Base class of every error weft_django raises."""


class ConfigurationError(WeftError, ImproperlyConfigured):
    """The WEFT settings are invalid. The message names the setting and the rule."""


class WorkflowNotRegisteredError(WeftError):
    """No @workflow of this name (and version) is registered in this process: import its module."""


class WorkflowAlreadyExistsError(WeftError):
    """A workflow with this id exists and ``on_conflict`` says to refuse (``start(..., on_conflict=)``);
    or the existing run is of another workflow type (with an idempotency key or ``use_existing``); or
    ``on_conflict="start_new"`` found it still active."""


class WorkflowNotFoundError(WeftError):
    """No workflow has this id (never started, or purged)."""


class WorkflowTerminalError(WeftError):
    """The run has ended; a signal, update or transition needs a running one."""


class WorkflowStateError(WeftError):
    """The run's status does not allow this transition (suspend a running run, resume a suspended
    one, retry a failed one)."""


def _error_dict(error: dict[str, Any] | None) -> dict[str, Any]:
    return dict(error or {})


class WorkflowFailedError(WeftError):
    """The run failed. ``.error`` is ``{"type", "message", "traceback"}``."""

    def __init__(self, message: str, error: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.error = _error_dict(error)


class WorkflowCancelledError(WeftError):
    """The run was cancelled (raised by ``result()``)."""


class WorkflowTimedOutError(WeftError):
    """The run passed its execution timeout (raised by ``result()``)."""


class ActivityError(WeftError):
    """A failed activity, thrown into workflow code. The same live and on replay."""

    def __init__(
        self,
        message: str,
        *,
        type: str = "Exception",
        qualified_type: str = "",
        traceback: str = "",
        attempts: int = 1,
        activity: str = "",
    ) -> None:
        super().__init__(f"Activity {activity!r} failed after {attempts} attempt(s): {type}: {message}")
        self.message = message
        self.type = type
        self.qualified_type = qualified_type or type
        self.traceback = traceback
        self.attempts = attempts
        self.activity = activity

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "qualified_type": self.qualified_type,
            "message": self.message,
            "traceback": self.traceback,
            "attempts": self.attempts,
            "activity": self.activity,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ActivityError:
        """Rebuild it from a recorded step error. CorruptPayloadError when ``data`` is not of the shape
        ``to_dict`` writes (a damaged row: the engine makes the workflow stuck rather than guess)."""
        if not isinstance(data, dict):
            raise CorruptPayloadError(f"an activity error must be a JSON object, found {data!r:.60}")
        texts = {}
        for key, default in (
            ("message", ""),
            ("type", "Exception"),
            ("qualified_type", ""),
            ("traceback", ""),
            ("activity", ""),
        ):
            value = data.get(key)
            value = default if value is None else value
            if not isinstance(value, str):
                raise CorruptPayloadError(f"the activity error's {key!r} must be a string, found {value!r:.60}")
            texts[key] = value
        attempts = data.get("attempts", 1)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise CorruptPayloadError(f"the activity error's 'attempts' must be a whole number, found {attempts!r:.60}")
        return cls(
            texts["message"],
            type=texts["type"],
            qualified_type=texts["qualified_type"],
            traceback=texts["traceback"],
            attempts=attempts,
            activity=texts["activity"],
        )


class ActivityTimeoutError(WeftError):
    """An activity attempt ran past its timeout (recorded as the failure's type; name it in
    RetryPolicy.non_retryable to stop retrying timed-out attempts)."""


class ActivityCancelledError(WeftError):
    """Raised by weft.heartbeat() once the attempt should stop."""


class ChildWorkflowError(WeftError):
    """A child workflow ended without completing; thrown into the parent. ``.child_id``, ``.status``, ``.error``."""

    def __init__(self, message: str, *, child_id: str, status: str, error: dict[str, Any] | None = None):
        super().__init__(message)
        self.child_id = child_id
        self.status = status
        self.error = _error_dict(error)


class QueryFailedError(WeftError):
    """The query handler raised. ``.error`` is the handler's error as a dict."""

    def __init__(self, message: str, error: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.error = _error_dict(error)


def issue_path(path: Any) -> str:
    """An issue's path as text: ["items", 0, "qty"] -> "items[0].qty"; "" for none."""
    if path is None or path == []:
        return ""
    parts = path if isinstance(path, list | tuple) else [path]
    text = ""
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


class UpdateValidationError(WeftError):
    """The update's validator refused it; nothing was applied. ``.issues``: its ``{"message", "path"}``
    dicts; the message names each issue's path before its message ("text: This field is required.")."""

    def __init__(self, name: str, issues: list[dict[str, Any]]) -> None:
        self.name = name
        self.issues = issues
        joined = "; ".join(
            f"{where}: {issue.get('message')}"
            if (where := issue_path(issue.get("path")))
            else str(issue.get("message"))
            for issue in issues
        )
        super().__init__(f'Update "{name}" rejected by validator: {joined}')


class UpdateFailedError(WeftError):
    """The update handler raised; the run goes on. ``.error`` is the handler's error as a dict."""

    def __init__(self, message: str, error: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.error = _error_dict(error)


class UpdateTimeoutError(WeftError):
    """No engine answered the update within its timeout; it may still be applied later."""


class QueryNotFoundError(WeftError):
    """The workflow registered no query handler of this name."""


class QueryTimeoutError(WeftError):
    """No engine answered the query within its timeout."""


class WaitTimeoutError(WeftError):
    """A wait_for_signal (or other wait) ran past its timeout."""


class NonDeterminismError(WeftError):
    """Workflow code yielded a different operation than the recorded one at that position."""


class VersionMismatchError(WeftError):
    """The stored run's version is not registered in this process."""


class PayloadSizeExceededError(WeftError):
    """An encoded payload is larger than WEFT["PAYLOAD_MAX_BYTES"]."""


class PayloadNotSerializableError(WeftError):
    """A value cannot be encoded exactly by the codec. ``.path`` names where in the value."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class CorruptPayloadError(WeftError, ValueError):
    """Stored text is not valid codec output (a damaged or hand-edited payload row).

    The engine never lets one escape: a run whose input cannot be decoded fails with it; a run whose
    recorded history (a step's result or error, a delivered signal's payload, an applied update)
    cannot be decoded is stuck with it, shown in the admin and ``weft describe``, until the row is
    repaired or the run is cancelled (docs/reliability.md)."""


class EngineInternalError(WeftError):
    """The engine failed while driving one workflow (a bug in weft_django, not in workflow code).

    The workflow is stuck with this error and retried with back-off; the engine keeps serving its
    other workflows. The message names the original exception; report it with the engine's log."""


class IdempotencyKeyPurgedError(WeftError):
    """The idempotency key belonged to a run that is gone: retention purged it, or a start with
    ``on_conflict="start_new"`` replaced it. Use a new key."""


class WorkflowNotLocallyOwnedError(WeftError):
    """The workflow is not held by this engine (a query or update reached the wrong engine)."""


class WorkflowClaimUnavailableError(WeftError):
    """The workflow's claim could not be taken (another engine holds it)."""


class OwnershipModeMismatchError(WeftError):
    """This engine's OWNERSHIP_MODE differs from the one the store was started with."""


class EngineLeaseAcquisitionTimeoutError(WeftError):
    """The store-wide engine lease (single-engine modes) was not acquired in time."""


__all__ = [name for name, value in list(globals().items()) if isinstance(value, type) and issubclass(value, WeftError)]


class WorkflowDefinitionError(WeftError, TypeError):
    """A @workflow / @activity definition is invalid (not a generator, a taken name, bad options)."""


class InvalidArgumentError(WeftError, ValueError):
    """An argument to the client is invalid. The message names it and says what to pass instead."""


class InvalidWorkflowIdError(InvalidArgumentError):
    """A workflow id is not 1-255 characters without control characters."""


class ScheduleNotFoundError(WeftError, LookupError):
    """No schedule has this id (never created, or deleted)."""


class InvalidScheduleError(InvalidArgumentError):
    """An argument of weft.schedule() / ScheduleHandle.update() is invalid; nothing was written."""


class UnusableScheduleError(InvalidScheduleError):
    """A stored schedule row cannot be used as it is (edited by hand, restored from elsewhere): both or
    neither of cron / every, an invalid cron (or one that never matches), time zone, interval or jitter,
    args / kwargs that do not decode (or are not a list / a dict), or a next occurrence too close to year
    9999 to compute (or a next fire time Python cannot hold at all). Raised by ScheduleHandle.resume()
    (the timing), trigger() (args / kwargs), describe() (args / kwargs and, unless paused, the timing)
    and update() (args / kwargs it keeps); the
    engines skip the row and retry it later; nothing was written. ``.schedule_id`` and ``.column`` name
    the row and the column; repair it with ScheduleHandle.update() (the admin's form) or delete it."""

    def __init__(self, message: str, schedule_id: str = "", column: str = "") -> None:
        super().__init__(message)
        self.schedule_id = schedule_id
        self.column = column


class InvalidSearchAttributeError(InvalidArgumentError):
    """A search attribute is not declared on the workflow (``@weft.workflow(attributes=...)``), or its
    value does not have the declared type (or is out of bounds: text over 500 characters, an int beyond
    2**53, a naive datetime, a datetime outside years 1-9999 in UTC). Raised by ``ctx.set_attributes``
    inside workflow code (an uncaught one fails the run) and by ``weft.start(..., attributes=)``;
    nothing was written."""


class InvalidFilterError(InvalidArgumentError):
    """A filter of ``weft.list_workflows`` / ``count_workflows`` / the bulk operations, or a page
    cursor, is invalid. The message names the filter and the accepted forms; nothing was read or written."""


class InvalidForkError(InvalidArgumentError):
    """``weft.fork(id, from_step=N)`` cannot fork there: N is negative, beyond the run's recorded steps,
    or splits a step that has not settled. Nothing was written."""


class BulkCountChangedError(WeftError):
    """A bulk operation's ``expected_count`` no longer matches how many workflows its filter selects:
    nothing was changed. Count again (``weft.count_workflows``) and confirm the new number."""

    def __init__(self, message: str, expected: int, actual: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class UnknownQueueError(InvalidArgumentError):
    """A start (or @weft.workflow(queue=)) names a queue that WEFT["QUEUES"] does not define; nothing was written."""


__all__ += [
    "BulkCountChangedError",
    "InvalidArgumentError",
    "InvalidFilterError",
    "InvalidForkError",
    "InvalidScheduleError",
    "InvalidSearchAttributeError",
    "InvalidWorkflowIdError",
    "ScheduleNotFoundError",
    "UnknownQueueError",
    "UnusableScheduleError",
    "WorkflowDefinitionError",
]
