"""WeftModelAdmin: what the Workflow admin's actions and pages (actions.py, views.py, visibility.py) take
from the ModelAdmin that calls them. WorkflowAdmin (workflows.py) is one; defining it here lets those
modules name its type without importing workflows.py, which imports them."""

from __future__ import annotations

from django.contrib import admin

from ..conf import database_alias


class WeftModelAdmin(admin.ModelAdmin):
    """A ModelAdmin of weft's rows: Django's, and ``weft_alias``, the database they are read from."""

    @property
    def weft_alias(self) -> str:
        """The database alias of weft's tables (the ``WEFT`` setting's)."""
        return database_alias()
