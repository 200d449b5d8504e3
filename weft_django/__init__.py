"""weft_django: durable workflows for Django.

Everything public is importable from here. Names are re-exported lazily (PEP 562), so importing
this package while Django loads INSTALLED_APPS never imports models or touches the app registry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # definitions
    "workflow": "weft_django.registry",
    "activity": "weft_django.registry",
    "RetryPolicy": "weft_django.registry",
    "WorkflowContext": "weft_django.context",
    "heartbeat": "weft_django.activity_runtime",
    "activity_info": "weft_django.activity_runtime",
    "ActivityInfo": "weft_django.activity_runtime",
    # client
    "start": "weft_django.client",
    "astart": "weft_django.client",
    "start_many": "weft_django.client",
    "astart_many": "weft_django.client",
    "StartRequest": "weft_django.client",
    "get_handle": "weft_django.client",
    "WorkflowHandle": "weft_django.client",
    "signal": "weft_django.client",
    "query": "weft_django.client",
    "update": "weft_django.client",
    "cancel": "weft_django.client",
    "start_or_signal": "weft_django.client",
    "start_with_update": "weft_django.client",
    # visibility, fork, bulk operations (issue 19)
    "list_workflows": "weft_django.visibility",
    "count_workflows": "weft_django.visibility",
    "alist_workflows": "weft_django.visibility",
    "acount_workflows": "weft_django.visibility",
    "WorkflowSummary": "weft_django.visibility",
    "WorkflowPage": "weft_django.visibility",
    "fork": "weft_django.forking",
    "afork": "weft_django.forking",
    "bulk_count": "weft_django.bulk",
    "bulk_cancel": "weft_django.bulk",
    "bulk_retry": "weft_django.bulk",
    "bulk_purge": "weft_django.bulk",
    "abulk_cancel": "weft_django.bulk",
    "abulk_retry": "weft_django.bulk",
    "abulk_purge": "weft_django.bulk",
    "BulkResult": "weft_django.bulk",
    # schedules
    "schedule": "weft_django.schedules",
    "get_schedule": "weft_django.schedules",
    "ScheduleHandle": "weft_django.schedules",
    # maintenance
    "run_maintenance": "weft_django.engine.maintenance",
    # choices
    "WorkflowStatus": "weft_django.status",
}

# Every WeftError subclass (weft_django/exceptions.py; the tree is in its docstring and docs/errors.md).
_EXCEPTIONS = [
    "WeftError",
    "ConfigurationError",
    "WorkflowDefinitionError",
    "InvalidArgumentError",
    "InvalidWorkflowIdError",
    "InvalidScheduleError",
    "UnusableScheduleError",
    "InvalidSearchAttributeError",
    "InvalidFilterError",
    "InvalidForkError",
    "BulkCountChangedError",
    "UnknownQueueError",
    "WorkflowNotRegisteredError",
    "VersionMismatchError",
    "WorkflowAlreadyExistsError",
    "IdempotencyKeyPurgedError",
    "WorkflowNotFoundError",
    "ScheduleNotFoundError",
    "WorkflowTerminalError",
    "WorkflowStateError",
    "WorkflowFailedError",
    "WorkflowCancelledError",
    "WorkflowTimedOutError",
    "WaitTimeoutError",
    "ActivityError",
    "ActivityTimeoutError",
    "ActivityCancelledError",
    "ChildWorkflowError",
    "QueryNotFoundError",
    "QueryFailedError",
    "QueryTimeoutError",
    "UpdateValidationError",
    "UpdateFailedError",
    "UpdateTimeoutError",
    "PayloadSizeExceededError",
    "PayloadNotSerializableError",
    "CorruptPayloadError",
    "NonDeterminismError",
    "EngineInternalError",
    "WorkflowNotLocallyOwnedError",
    "WorkflowClaimUnavailableError",
    "OwnershipModeMismatchError",
    "EngineLeaseAcquisitionTimeoutError",
]
_EXPORTS.update({name: "weft_django.exceptions" for name in _EXCEPTIONS})
_EXPORTS["ResultTimeoutError"] = "weft_django.waits"

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'weft_django' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .activity_runtime import ActivityInfo, activity_info, heartbeat
    from .bulk import (
        BulkResult,
        abulk_cancel,
        abulk_purge,
        abulk_retry,
        bulk_cancel,
        bulk_count,
        bulk_purge,
        bulk_retry,
    )
    from .client import (
        StartRequest,
        WorkflowHandle,
        astart,
        astart_many,
        cancel,
        get_handle,
        query,
        signal,
        start,
        start_many,
        start_or_signal,
        start_with_update,
        update,
    )
    from .context import WorkflowContext
    from .engine.maintenance import run_maintenance
    from .exceptions import *  # noqa: F403
    from .forking import afork, fork
    from .registry import RetryPolicy, activity, workflow
    from .schedules import ScheduleHandle, get_schedule, schedule
    from .status import WorkflowStatus
    from .visibility import (
        WorkflowPage,
        WorkflowSummary,
        acount_workflows,
        alist_workflows,
        count_workflows,
        list_workflows,
    )
    from .waits import ResultTimeoutError
