"""Claim rows: the only code that writes or locks ``WorkflowClaim`` (``tests/project/test_architecture.py``
checks it).

- ``holding``: acquire, renew, release, take over, and the fence locks of an engine's commits;
- ``renewal``: extending the claims an engine holds, in chunks, and the lost ones it finds;
- ``admission``: the claims of runs a queue admitted (the admitting engine holds them), and of the
  delayed starts an engine fires;
- ``lapse``: when a held claim has lapsed, as the admin and the doctor show it (the takeover rule, read-only);
- ``lifecycle``: the unheld claim of a new run (start, children, schedules), epoch rotation by the
  transitions, cancel's family lock, the test kit's claim edits.

Every claim lock is taken in workflow_id order, in one statement, before any other write of its
transaction. Every statement uses the database clock.
"""

from __future__ import annotations

from .admission import hold_admitted, start_delayed
from .holding import (
    CHUNK,
    CLAIM_TABLE,
    FENCE_CTE,
    WORKFLOW_TABLE,
    acquire,
    classify_unheld,
    holder,
    holders,
    insert_unheld,
    insert_unheld_many,
    lock_at_epochs,
    lock_batch_and_family,
    lock_claims,
    lock_ids,
    previous_holding,
    release_claims,
    release_cte_sql,
    release_locked_claims,
    take_over,
    why_lost,
)
from .lapse import TAKEOVER_GRACE_MULTIPLIER, has_lapsed, holder_heartbeat, holder_silent, lapsed, takeover_grace
from .lifecycle import (
    FAMILY_LOCK_ROUNDS,
    active_descendants,
    cap_expiry,
    delete_claims,
    expire_claims,
    held_claims,
    lock_claim,
    rotate_epoch,
    unheld_claim_sql,
    write_claim,
)
from .renewal import renew, renew_each

__all__ = [
    "CHUNK",
    "CLAIM_TABLE",
    "FAMILY_LOCK_ROUNDS",
    "FENCE_CTE",
    "TAKEOVER_GRACE_MULTIPLIER",
    "WORKFLOW_TABLE",
    "acquire",
    "active_descendants",
    "cap_expiry",
    "classify_unheld",
    "delete_claims",
    "expire_claims",
    "has_lapsed",
    "held_claims",
    "hold_admitted",
    "holder",
    "holder_heartbeat",
    "holder_silent",
    "holders",
    "insert_unheld",
    "insert_unheld_many",
    "lapsed",
    "lock_at_epochs",
    "lock_batch_and_family",
    "lock_claim",
    "lock_claims",
    "lock_ids",
    "previous_holding",
    "release_claims",
    "release_cte_sql",
    "release_locked_claims",
    "renew",
    "renew_each",
    "rotate_epoch",
    "start_delayed",
    "take_over",
    "takeover_grace",
    "unheld_claim_sql",
    "why_lost",
    "write_claim",
]
