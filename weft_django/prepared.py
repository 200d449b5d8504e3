"""Moved to ``weft_django.store.prepared`` (issue 15); re-exported here while the engine imports it."""

# moved to weft_django.store.prepared (issue 15): re-export until callers move
from .store.prepared import MAX_MISSES, execute, numbered, statement_name  # noqa: F401
