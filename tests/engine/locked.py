"""One row of a weft table locked by a user's open transaction (PostgreSQL) while a real engine runs:
what the tests of the engine's chores check, whatever row and chore (tests/engine/test_chores_locked_rows.py,
tests/queues/test_admission_locked_rows.py, tests/schedules/test_schedule_locked_rows.py).

The engine must (1) go on serving other workflows (a good workflow started meanwhile finishes while the
lock is still held), (2) keep renewing its claims and heartbeating its row, (3) neither log an error
nor a warning on every pass, and (4) do what the row held back once the lock goes."""

from __future__ import annotations

import logging
import time
from typing import Any

import weft_django as weft
from tests.engine.test_commit_locks import holding
from weft_django.models import Engine, WorkflowClaim

# The row locks a user's transaction may take. A plain UPDATE takes FOR NO KEY UPDATE (blocked by all but
# FOR KEY SHARE), a DELETE takes FOR UPDATE (blocked by all four).
LOCKS = {
    "for-update": "FOR UPDATE",
    "for-no-key-update": "FOR NO KEY UPDATE",
    "for-share": "FOR SHARE",
    "for-key-share": "FOR KEY SHARE",
}
UPDATE_BLOCKERS = ["for-update", "for-no-key-update", "for-share"]


@weft.workflow(name="tests.locked.parked")
def parked_workflow(ctx: Any) -> Any:
    return (yield ctx.wait_for_signal("go"))


def parked(workflow_id: str = "parked") -> None:
    """A workflow the engine holds for the whole test (its claim's renewal is watched)."""
    weft.start("tests.locked.parked", id=workflow_id)


def row_lock(table: str, column: str, value: Any, lock: str = "for-update") -> tuple[str, list[Any]]:
    """The statement that locks one row of ``table`` (``weft_django_<table>``) where ``column`` = ``value``."""
    return f"SELECT 1 FROM weft_django_{table} WHERE {column} = %s {LOCKS[lock]}", [value]


class Held:
    """One row locked by another connection's open transaction (``holding``) from construction (before
    the engine the test starts next) until ``let_go()`` or the end of the ``with`` block."""

    def __init__(self, sql: str, params: list[Any], hold_at_most: float = 40.0) -> None:
        self._hold = holding(sql, params, hold_at_most=hold_at_most)
        self.released = self._hold.__enter__()

    def let_go(self) -> None:
        self._hold.__exit__(None, None, None)

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        self.let_go()


def finishes_within(handle: Any, limit: float) -> float:
    """Seconds ``handle``'s result took (inf: not within ``limit``)."""
    began = time.monotonic()
    try:
        handle.result(timeout=limit)
    except Exception:
        return float("inf")
    return time.monotonic() - began


def good_workflow_took(workflow_id: str = "good", limit: float = 20.0) -> float:
    """Start tests.sum under ``workflow_id`` and return the seconds it took to finish."""
    return finishes_within(weft.start("tests.sum", args=[2, 3], id=workflow_id), limit)


class Vitals:
    """The engine's claim renewal and heartbeat, read before and after a lock was held: both must have
    moved on (renewal every WORKFLOW_CLAIM_RENEW_INTERVAL, the heartbeat after each renewal pass)."""

    def __init__(self, engine_id: str, parked: str) -> None:
        self.engine_id, self.parked = engine_id, parked
        self.before = self._read()

    def _read(self) -> tuple[Any, Any]:
        claim = WorkflowClaim.objects.filter(pk=self.parked, engine_id=self.engine_id).values_list("expires_at")
        beat = Engine.objects.filter(pk=self.engine_id).values_list("heartbeat_at")
        return (claim.first() or (None,))[0], (beat.first() or (None,))[0]

    def moved_on(self, timeout: float = 15.0) -> tuple[bool, bool]:
        """Whether the parked workflow's claim was renewed and the engine row heartbeat, since the start."""
        deadline = time.monotonic() + timeout
        while True:
            expires, beat = self._read()
            renewed = expires is not None and self.before[0] is not None and expires > self.before[0]
            beating = beat is not None and self.before[1] is not None and beat > self.before[1]
            if (renewed and beating) or time.monotonic() > deadline:
                return renewed, beating
            time.sleep(0.1)


def noisy(records: list[logging.LogRecord], *, at_most: int = 2) -> list[str]:
    """The weft log lines of a held row, if they are more than a few warnings or any error: one per pass
    (or an error) is the engine spinning on the row, not telling once that it waits."""
    lines = [f"{r.levelname} {r.getMessage()[:200]}" for r in records if r.name.startswith("weft_django")]
    errors = [line for line in lines if not line.startswith(("WARNING", "INFO", "DEBUG"))]
    warnings = [line for line in lines if line.startswith("WARNING")]
    return lines if errors or len(warnings) > at_most else []
