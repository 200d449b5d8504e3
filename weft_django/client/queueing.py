"""A start's queue options: ``weft_django.queueing`` (the workflow side uses it too, for children)."""

from ..queueing import queue_options

__all__ = ["queue_options"]
