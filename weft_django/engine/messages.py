"""Queries and updates addressed to workflows this engine owns (the messages issue fills this in)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Engine
    from .fencing import WorkflowWrites


def deliver_messages(
    engine: Engine,
    workflow_ids: set[str],
    queries_waiting: bool,
    now: datetime,
    writes: dict[str, WorkflowWrites],
    changed: set[str],
) -> bool:
    """Answer pending query requests addressed to this engine and apply admitted updates of the owned
    ``workflow_ids``. Returns whether anything was done. Not built yet: nothing is routed."""
    return False
