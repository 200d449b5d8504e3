"""The database clocks, read at most once per admin request (pages compare many rows with "now")."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest

from ..conf import database_alias
from ..store.clock import db_clock, db_now


def claim_now(request: HttpRequest) -> datetime:
    """The raw database clock (claims, heartbeats), once per request."""
    now: datetime | None = getattr(request, "_weft_claim_now", None)
    if now is None:
        now = db_clock(database_alias())
        request._weft_claim_now = now  # type: ignore[attr-defined]
    return now


def workflow_now(request: HttpRequest) -> datetime:
    """Workflow time (timers, deadlines, retention), once per request."""
    now: datetime | None = getattr(request, "_weft_workflow_now", None)
    if now is None:
        now = db_now(database_alias())
        request._weft_workflow_now = now  # type: ignore[attr-defined]
    return now
