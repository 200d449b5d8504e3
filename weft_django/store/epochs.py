"""Fencing epochs: one global, strictly increasing sequence shared by every workflow id."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
