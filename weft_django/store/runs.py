"""Runs and steps: creating a run (start, children, schedules), writing steps, run status rows."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
