import importlib

from django.apps import AppConfig
from django.conf import settings


class WeftConfig(AppConfig):
    name = "weft_django"
    label = "weft_django"
    verbose_name = "Weft workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # No queries here: checks are registered, workflow modules imported.
        from . import checks  # noqa: F401  (registers the system checks)
        from .registry import autodiscover

        autodiscover()
        if uses_tasks_backend():
            importlib.import_module("weft_django.tasks.workflows")  # the workflow every django.tasks task runs


def uses_tasks_backend() -> bool:
    """True when settings.TASKS names weft_django.tasks.WeftBackend (then engines and workers must know
    its workflow and activity)."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return False
    return any(
        isinstance(params, dict) and str(params.get("BACKEND", "")).startswith("weft_django.tasks")
        for params in configured.values()
    )
