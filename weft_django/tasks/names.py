"""The names the Tasks backend, its workflow and its results share (no imports: the lowest module of
weft_django.tasks, so backend.py, which loads workflows.py and results.py, is imported by neither)."""

from __future__ import annotations

WORKFLOW_NAME = "weft_django.tasks.run"
ACTIVITY_NAME = "weft_django.tasks.call"


def is_weft_backend(backend: object) -> bool:
    """True when ``backend`` is a ``WeftBackend`` (or a subclass): its class carries ``weft_workflow``,
    the name of the workflow that runs its tasks."""
    return getattr(type(backend), "weft_workflow", None) == WORKFLOW_NAME
