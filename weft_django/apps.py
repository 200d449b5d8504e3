import importlib
import importlib.util

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string


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
    """True when settings.TASKS names weft_django.tasks.WeftBackend or a subclass of it (then engines
    and workers must know its workflow and activity) and a Tasks framework is installed. Each BACKEND
    path is imported and checked with ``names.is_weft_backend_class``, the rule every other part of
    weft_django.tasks uses. A path that cannot be imported, or no Tasks framework (Django 5.2 and no
    django-tasks), is left to Django, which raises when it first builds that backend, as for any
    backend that cannot be imported; start-up is left alone."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return False
    if not any(importlib.util.find_spec(name) is not None for name in ("django.tasks", "django_tasks")):
        return False
    from .tasks.names import is_weft_backend_class

    for params in configured.values():
        path = params.get("BACKEND") if isinstance(params, dict) else None
        if not isinstance(path, str):
            continue
        try:
            backend = import_string(path)
        except (ImportError, ImproperlyConfigured):  # Django raises it when it builds that backend
            continue
        if is_weft_backend_class(backend):
            return True
    return False
