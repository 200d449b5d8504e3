"""Moved to ``weft_django.store.notify`` (issue 15); re-exported here while the engine imports it."""

# moved to weft_django.store.notify (issue 15): re-export until callers move
from .store.notify import CHANNEL, MAX_PAYLOAD, send, send_many  # noqa: F401
