"""What activity code sees while it runs: ``weft.activity_info()`` and ``weft.heartbeat()``."""

from __future__ import annotations

import dataclasses
import signal
import threading
from typing import Any

from .exceptions import ActivityCancelledError, WeftError


@dataclasses.dataclass(frozen=True)
class ActivityInfo:
    workflow_id: str
    run_id: str
    activity: str
    seq: int
    attempt: int  # 1-based
    epoch: int
    idempotency_key: str  # f"{workflow_id}:{run_id}:{seq}": stable across attempts and epochs


class AttemptControl:
    """Shared between the running attempt and its engine: heartbeat details in, stop requests out."""

    def __init__(self, info: ActivityInfo) -> None:
        self.info = info
        self.details: Any = None
        self.heartbeat_count = 0
        self.stop_reason: str | None = None
        # Held by an atomic attempt while it commits, and by the engine while it times an attempt out:
        # exactly one of the two wins.
        self.lock = threading.Lock()
        self.finished = False

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason


_local = threading.local()


def bind(control: AttemptControl | None) -> None:
    _local.control = control


def current_control() -> AttemptControl | None:
    return getattr(_local, "control", None)


def activity_info() -> ActivityInfo:
    """The running attempt's identity. Raises outside an activity."""
    control = current_control()
    if control is None:
        raise WeftError(
            "weft.activity_info() was called outside an activity; call it from activity code run by an engine."
        )
    return control.info


def heartbeat(details: Any = None) -> None:
    """Report progress (served by the built-in query "activity_progress"). Raises
    ActivityCancelledError once the attempt should stop. A no-op outside an activity."""
    control = current_control()
    if control is None:
        return
    control.details = details
    control.heartbeat_count += 1
    if control.stop_reason is not None:
        raise ActivityCancelledError(
            f"Activity {control.info.activity!r} attempt {control.info.attempt} should stop: {control.stop_reason}."
        )


# Worker frameworks whose BaseExceptions end the worker, not the attempt (Celery's WorkerTerminate and
# WorkerShutdown, billiard's, gevent's and eventlet's timeouts and kills).
_FRAMEWORKS = frozenset({"celery", "billiard", "gevent", "eventlet", "greenlet"})


def propagates(exc: BaseException, *, worker: bool = False) -> bool:
    """Whether an exception raised while an activity ran must leave the attempt instead of failing it:
    Ctrl+C (a KeyboardInterrupt on the main thread while Python's own SIGINT handler is installed) and,
    on a worker (``worker``: a Celery worker running the attempt), the worker framework's own signals.
    Anything else, SystemExit included, a KeyboardInterrupt that user code raised on a worker thread or
    in an engine (which installs its own SIGINT handler), and a framework's exception raised on an
    engine's threads or loop (no such framework runs them: it is user code's, a ``gevent.Timeout`` say),
    is a failed attempt, retried by the activity's policy; left to propagate it ended the thread or the
    engine loop, and the engine waited for an outcome that never came.

    Args:
        exc: what the activity raised.
        worker: the attempt runs on a worker framework's process (Celery), not on an engine.
    """
    if isinstance(exc, Exception):
        return False
    if isinstance(exc, KeyboardInterrupt):
        on_main = threading.current_thread() is threading.main_thread()
        return on_main and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    return worker and type(exc).__module__.split(".")[0] in _FRAMEWORKS
