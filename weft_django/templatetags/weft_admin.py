"""Template filters of weft's admin pages."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template

from ..admin.formatting import when_text

register = template.Library()


@register.filter
def weft_moment(value: Any, fmt: str = "%Y-%m-%d %H:%M:%S") -> Any:
    """A timestamp in the current time zone (strftime ``fmt``), never an error: one a day from the
    ends of Python's dates (an odd row) is shown in UTC, marked "out of range". Django's own
    rendering and ``|date`` would raise OverflowError for it. Other values are returned unchanged
    (None as "-")."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return when_text(value, fmt)
    return value
