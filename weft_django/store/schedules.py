"""Schedule rows: upsert, pause, resume, due schedules for the firing chore."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
