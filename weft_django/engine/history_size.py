"""The history-size warning: a run whose step log reaches WEFT["HISTORY_WARN_STEPS"] steps is logged
once per load at WARNING, suggesting ``ctx.continue_as_new`` (every recovery replays the whole log,
so an unbounded one makes every takeover slower)."""

from __future__ import annotations

import logging

from ..conf import history_warn_steps
from .owned import Owned

logger = logging.getLogger("weft_django.engine.engine")


def warn_if_long(owned: Owned) -> None:
    """Log once (per load of this run) when its history has reached the configured size.

    Args:
        owned: the workflow just advanced.
    """
    if owned.history_warned:
        return
    if owned.history_limit == -1:  # read once per load, not on every turn
        owned.history_limit = history_warn_steps()
    limit = owned.history_limit
    steps = owned.run.next_seq
    if limit is None or steps < limit:
        return
    owned.history_warned = True
    logger.warning(
        "workflow history is long workflow=%s run=%s steps=%s limit=%s: every recovery replays all of it; "
        "end the run with ctx.continue_as_new(...) to go on in a fresh run with an empty history "
        '(WEFT["HISTORY_WARN_STEPS"])',
        owned.workflow_id,
        owned.run_id,
        steps,
        limit,
    )
