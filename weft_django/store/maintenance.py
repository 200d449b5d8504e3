"""Engine-scoped chores' statements: retention purge and sweeps."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
