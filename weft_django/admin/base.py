"""WeftModelAdmin: what the Workflow admin's actions and pages (actions.py, views.py, visibility.py) take
from the ModelAdmin that calls them. WorkflowAdmin (workflows.py) is one; defining it here lets those
modules name its type without importing workflows.py, which imports them.

GuardedChangelist: the base of every weft ModelAdmin, so a hand-made query string shows the list
(Django's "?e=1" redirect), not a server error."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.http import HttpRequest

from ..conf import database_alias


class GuardedChangelist(admin.ModelAdmin):
    """A ModelAdmin that treats what the database cannot take as Django treats a value of the wrong
    type: a NUL (PostgreSQL refuses it as a parameter) in a query string value (a list filter's value
    reaches the query unchecked) is a wrong lookup ("?e=1"), in an object id (a URL) an object that
    does not exist, in the ids an action selects a refused action; a date-hierarchy day whose next
    day is past year 9999 (Django's hierarchy overflows computing it) is a wrong lookup."""

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        if any("\x00" in key or "\x00" in value for key, values in request.GET.lists() for value in values):
            raise IncorrectLookupParameters("A query parameter holds NUL.")
        try:
            return super().get_changelist_instance(request)
        except OverflowError as exc:
            raise IncorrectLookupParameters(f"A date out of range: {exc}.") from exc

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        if "\x00" in object_id:
            return None  # no row has it: the change page says the object does not exist
        return super().get_object(request, object_id, from_field)

    def response_action(self, request: HttpRequest, queryset: Any, *args: Any, **kwargs: Any) -> Any:
        if any("\x00" in pk for pk in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)):
            self.message_user(request, "No action was taken: a selected id holds NUL.", messages.WARNING)
            return None
        return super().response_action(request, queryset, *args, **kwargs)


class WeftModelAdmin(GuardedChangelist):
    """A ModelAdmin of weft's rows: Django's, and ``weft_alias``, the database they are read from."""

    @property
    def weft_alias(self) -> str:
        """The database alias of weft's tables (the ``WEFT`` setting's)."""
        return database_alias()
