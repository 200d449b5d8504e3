"""The fenced commit: the one transaction boundary for workflow-scoped writes.

The engine's batch commit, the client-side transitions (cancel, suspend, resume, retry, purge), a
parent's children, update settlement and Celery completions all write through here: one
transaction whose first statement locks the claims (sorted, one statement) and whose writes count
only where the lock proved the writer's epoch."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
