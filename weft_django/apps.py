import importlib
import importlib.util

from django.apps import AppConfig
from django.conf import settings


class WeftConfig(AppConfig):
    name = "weft_django"
    label = "weft_django"
    verbose_name = "Weft workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # No queries here: checks are registered, workflow modules imported.
        from . import (
            checks,  # noqa: F401  (registers the system checks)
            client,  # noqa: F401  (installs WorkflowDefinition.start's starter: weft_django/starter.py)
        )
        from .registry import autodiscover

        autodiscover()
        if uses_tasks_backend():
            importlib.import_module("weft_django.tasks.workflows")  # the workflow every django.tasks task runs


def uses_tasks_backend() -> bool:
    """True when settings.TASKS names weft_django.tasks.WeftBackend (then engines and workers must know
    its workflow and activity) and a Tasks framework is installed. Without one (Django 5.2 and no
    django-tasks) the backend itself raises ImproperlyConfigured saying what to install, when Django
    first builds it, as for any backend that cannot be imported; start-up is left alone."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return False
    named = any(
        isinstance(params, dict) and str(params.get("BACKEND", "")).startswith("weft_django.tasks")
        for params in configured.values()
    )
    return named and any(importlib.util.find_spec(name) is not None for name in ("django.tasks", "django_tasks"))
