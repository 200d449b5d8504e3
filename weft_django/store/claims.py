"""Claim rows: the only module that writes or locks ``WorkflowClaim``.

Acquire, renew, release and take over (the engine), the unheld claim of a new run (start, children,
schedules), and the fence locks: every claim lock is taken in workflow_id order, in one statement,
before any other write of its transaction. Every statement uses the database clock."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
