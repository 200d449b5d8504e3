"""Fencing epochs: moved to ``weft_django.store.epochs`` (issue 15)."""

from __future__ import annotations

from .store.epochs import (  # moved to weft_django.store.epochs (issue 15): re-export until callers move
    next_epoch,
    next_epoch_sql,
)

__all__ = ["next_epoch", "next_epoch_sql"]
