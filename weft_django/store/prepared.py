"""Named prepared statements for the hottest PostgreSQL statements, safe behind poolers."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
