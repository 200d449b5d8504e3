"""The WeftError hierarchy. Every message says what to do about it."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured


class WeftError(Exception):
    """Base class of every error weft_django raises."""


class ConfigurationError(WeftError, ImproperlyConfigured):
    """The WEFT settings are invalid. The message names the setting and the rule."""


class WorkflowNotRegisteredError(WeftError):
    pass


class WorkflowAlreadyExistsError(WeftError):
    pass


class WorkflowNotFoundError(WeftError):
    pass


class WorkflowTerminalError(WeftError):
    pass


class WorkflowStateError(WeftError):
    pass


def _error_dict(error: dict[str, Any] | None) -> dict[str, Any]:
    return dict(error or {})


class WorkflowFailedError(WeftError):
    """The run failed. ``.error`` is ``{"type", "message", "traceback"}``."""

    def __init__(self, message: str, error: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.error = _error_dict(error)


class WorkflowCancelledError(WeftError):
    pass


class WorkflowTimedOutError(WeftError):
    pass


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
    def __init__(self, message: str, *, child_id: str, status: str, error: dict[str, Any] | None = None):
        super().__init__(message)
        self.child_id = child_id
        self.status = status
        self.error = _error_dict(error)


class QueryFailedError(WeftError):
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
    """A validator refused an update. ``issues``: its ``{"message", "path"}`` dicts; the message names each
    issue's path before its message ("text: This field is required.")."""

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
    def __init__(self, message: str, error: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.error = _error_dict(error)


class UpdateTimeoutError(WeftError):
    pass


class QueryNotFoundError(WeftError):
    pass


class QueryTimeoutError(WeftError):
    pass


class WaitTimeoutError(WeftError):
    """A wait_for_signal (or other wait) ran past its timeout."""


class NonDeterminismError(WeftError):
    """Workflow code yielded a different operation than the recorded one at that position."""


class VersionMismatchError(WeftError):
    """The stored run's version is not registered in this process."""


class PayloadSizeExceededError(WeftError):
    pass


class PayloadNotSerializableError(WeftError):
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
    pass


class WorkflowNotLocallyOwnedError(WeftError):
    pass


class WorkflowClaimUnavailableError(WeftError):
    pass


class OwnershipModeMismatchError(WeftError):
    pass


class EngineLeaseAcquisitionTimeoutError(WeftError):
    pass


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


__all__ += [
    "InvalidArgumentError",
    "InvalidScheduleError",
    "InvalidWorkflowIdError",
    "ScheduleNotFoundError",
    "WorkflowDefinitionError",
]
