from django.apps import AppConfig


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
