"""The names the Tasks backend, its workflow and its results share (no imports: the lowest module of
weft_django.tasks, so backend.py, which loads workflows.py and results.py, is imported by neither)."""

from __future__ import annotations

WORKFLOW_NAME = "weft_django.tasks.run"
ACTIVITY_NAME = "weft_django.tasks.call"


def is_weft_backend_class(cls: object) -> bool:
    """True when ``cls`` is ``WeftBackend`` or a subclass: it carries ``weft_workflow``, the name of the
    workflow that runs its tasks. The one rule: get_result, the activity and start-up all use it."""
    return isinstance(cls, type) and getattr(cls, "weft_workflow", None) == WORKFLOW_NAME


def is_weft_backend(backend: object) -> bool:
    """True when ``backend`` is a ``WeftBackend`` (or a subclass) instance (``is_weft_backend_class``)."""
    return is_weft_backend_class(type(backend))
