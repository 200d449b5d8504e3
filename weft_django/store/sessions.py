"""Server-side bounds on the engine's own sessions (lock_timeout, idle_in_transaction_session_timeout)."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
