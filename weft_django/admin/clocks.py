"""The database clocks, read at most once per admin request (pages compare many rows with "now")."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.http import HttpRequest

from ..conf import DEFAULTS, database_alias, get_settings
from ..durations import to_timedelta
from ..exceptions import ConfigurationError
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


def claim_ttl(request: HttpRequest) -> timedelta:
    """WEFT["WORKFLOW_CLAIM_TTL"] (when a silent engine's claims count as lapsed), once per request. With
    invalid WEFT settings, the default: the pages still render (``manage.py check`` names the problem)."""
    ttl: timedelta | None = getattr(request, "_weft_claim_ttl", None)
    if ttl is None:
        try:
            ttl = get_settings().workflow_claim_ttl
        except ConfigurationError:
            ttl = to_timedelta(DEFAULTS["WORKFLOW_CLAIM_TTL"], "WORKFLOW_CLAIM_TTL")
        request._weft_claim_ttl = ttl  # type: ignore[attr-defined]
    return ttl
