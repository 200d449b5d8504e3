"""The one clock: the database's (``clock_timestamp()``), plus the test offset for workflow time."""

from __future__ import annotations

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
