"""Status values and other choices. Importable without the app registry."""

from django.db import models


class WorkflowStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUSPENDED = "suspended", "Suspended"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    TIMED_OUT = "timed_out", "Timed out"


TERMINAL_STATUSES = frozenset(
    {WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED, WorkflowStatus.TIMED_OUT}
)
ACTIVE_STATUSES = frozenset({WorkflowStatus.PENDING, WorkflowStatus.RUNNING, WorkflowStatus.SUSPENDED})


def is_terminal(status: str) -> bool:
    return status in TERMINAL_STATUSES


class StepKind(models.TextChoices):
    ACTIVITY = "activity", "Activity"
    SLEEP = "sleep", "Sleep"
    SIGNAL = "signal", "Wait for signal"
    UPDATE = "update", "Wait for update"
    WAIT_UNTIL = "wait_until", "Wait until"
    MEMO = "memo", "Memo"
    CHILD = "child", "Child workflow"
    ALL = "all", "All"
    RACE = "race", "Race"
    PATCH = "patch", "Patch marker"  # ctx.patched: this run took the change's new branch


class StepStatus(models.TextChoices):
    RUNNING = "running", "Running"  # an activity attempt dispatched; attempts is durable
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"  # the recorded outcome is an error (ActivityError, WaitTimeoutError, ...)


class TimerKind(models.TextChoices):
    SLEEP = "sleep", "Sleep"
    WAIT_CONDITION = "wait_condition", "Wait condition timeout"
    SIGNAL_TIMEOUT = "signal_timeout", "Signal timeout"
    ACTIVITY_RETRY = "activity_retry", "Activity retry"
    ACTIVITY_TIMEOUT = "activity_timeout", "Activity timeout"
    EXECUTION_DEADLINE = "execution_deadline", "Execution deadline"
    DELAYED_START = "delayed_start", "Delayed start"
    SCHEDULE = "schedule", "Schedule"
    CLEANUP = "cleanup", "Cleanup"


# Timers only the owner of the workflow selects and deletes (in its fenced commit).
WORKFLOW_SCOPED_TIMERS = frozenset(
    {
        TimerKind.SLEEP,
        TimerKind.WAIT_CONDITION,
        TimerKind.SIGNAL_TIMEOUT,
        TimerKind.ACTIVITY_RETRY,
        TimerKind.ACTIVITY_TIMEOUT,
        TimerKind.EXECUTION_DEADLINE,
    }
)


class UpdateStatus(models.TextChoices):
    ADMITTED = "admitted", "Admitted"
    ACCEPTED = "accepted", "Accepted"  # taken by a wait_for_update; respond() completes it
    REJECTED = "rejected", "Rejected"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"


class QueryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    ANSWERED = "answered", "Answered"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"


class SignalState(models.TextChoices):
    BUFFERED = "buffered", "Buffered"
    CONSUMED = "consumed", "Consumed"
    DROPPED = "dropped", "Dropped"


class OwnershipMode(models.TextChoices):
    NONE = "none", "none"
    LEASE = "lease", "lease"
    WORKFLOW_LEASE = "workflow-lease", "workflow-lease"


class OverlapPolicy(models.TextChoices):
    SKIP = "skip", "Skip"
    QUEUE = "queue", "Queue"
    CANCEL_RUNNING = "cancel_running", "Cancel running"
    ALLOW = "allow", "Allow"


class ParentClosePolicy(models.TextChoices):
    TERMINATE = "terminate", "Terminate"
    REQUEST_CANCEL = "request_cancel", "Request cancel"
    ABANDON = "abandon", "Abandon"
