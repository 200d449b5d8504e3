"""Wake-ups: NOTIFY sent on commit, and the LISTEN connection of an engine."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
