"""The mailbox: buffered signals and pending updates (insert, consume, settle, close, drop)."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
