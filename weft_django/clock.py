"""Moved to ``weft_django.store.clock`` (issue 15); re-exported here while the engine imports it."""

# moved to weft_django.store.clock (issue 15): re-export until callers move
from .store.clock import (  # noqa: F401
    _python_now,
    advance,
    clock_sql,
    db_clock,
    db_now,
    offset,
    offset_generation,
    set_offset,
    workflow_now_sql,
)
