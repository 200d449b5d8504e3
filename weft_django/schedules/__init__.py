"""Schedules: run a workflow on a cron expression or every N seconds (docs/schedules.md).

``weft.schedule()`` is an idempotent upsert by id; a ``ScheduleHandle`` pauses, resumes, triggers,
updates, deletes and describes one. Engines fire due occurrences (``engine/schedules.py``). This
package holds what both sides share: the time arithmetic (``timing``: cron in an IANA time zone,
intervals, deterministic jitter), the checks of the arguments (``fields``), how one occurrence
becomes a run under the overlap policy (``occurrences``) and the API (``handles``).

Every occurrence has a nominal UTC time and the run id ``f"{schedule_id}@{nominal:%Y-%m-%dT%H:%M:%SZ}"``;
jitter delays when it fires, never its id. The schedule row is the occurrence timer: whoever fires
it holds the row lock (engines take it with SKIP LOCKED), starts the run and advances
``next_nominal_at`` / ``next_fire_at`` in one transaction, so an occurrence starts at most one run.
Lock order: schedule row, then claim -> workflow (as everywhere).

A run queued by ``overlap="queue"`` is a ``pending`` workflow with no ``start_at`` and no timer; when
the slot frees, an engine gives it a delayed-start timer due now and the ordinary delayed-start path
(``ownership.fire_delayed_starts``) starts it with the acquire folded in.

Every name is importable from ``weft_django.schedules`` as before the split.
"""

from __future__ import annotations

from ..exceptions import InvalidScheduleError, ScheduleNotFoundError, UnusableScheduleError
from .fields import (  # noqa: F401 - the names the engine, the admin and tests import from here
    _TIMING_FIELDS,
    _arguments,
    _backfill,
    _cron,
    _every,
    _fields,
    _invalid,
    _jitter,
    _overlap,
    _timezone,
    retime,
    run_input,
    stored_argument,
    stored_arguments,
    stored_input,
    validate_schedule,
    validate_schedule_id,
)
from .handles import ScheduleHandle, _alias, _locked, _save, get_schedule, next_fire_times, schedule  # noqa: F401
from .occurrences import _insert_run, active_runs, cancel_waiting, fire, release_waiting  # noqa: F401
from .timing import (  # noqa: F401
    _DST_MARGIN,
    _UNSET,
    CRON_ALIASES,
    EXISTS,
    MAX_CRON_LENGTH,
    MAX_EVERY_SECONDS,
    MAX_JITTER_MS,
    MAX_SCHEDULE_ID_LENGTH,
    MAX_TIMEZONE_LENGTH,
    NEXT_FIRE_TIMES,
    OVERLAP_POLICIES,
    QUEUED,
    SKIPPED,
    STARTED,
    Timing,
    _ceil_second,
    _instants,
    check_timing_readable,
    manual_id,
    occurrence_id,
    unusable,
)

__all__ = [
    "InvalidScheduleError",
    "ScheduleHandle",
    "ScheduleNotFoundError",
    "Timing",
    "UnusableScheduleError",
    "get_schedule",
    "occurrence_id",
    "schedule",
    "validate_schedule",
]
