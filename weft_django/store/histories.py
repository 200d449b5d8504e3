"""Loading what an engine needs to resume workflows: runs, steps, applied updates, timers, admitted updates."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
