"""Wake-ups. On PostgreSQL a NOTIFY sent inside a transaction is delivered when it commits (and not at
all if it rolls back), so a wake-up can never overtake the row it announces. Elsewhere engines poll.

Payloads: ``w:<workflow_id>`` (a workflow needs attention: new, signalled, updated, transitioned),
``q:<engine_id>`` (a query waits for that engine), ``r:<workflow_id>`` (a run or update finished:
callers waiting for a result).
"""

from __future__ import annotations

from django.db import connections

CHANNEL = "weft"
MAX_PAYLOAD = 7900  # PostgreSQL refuses NOTIFY payloads of 8000 bytes or more


def send(kind: str, ident: str, using: str) -> None:
    """Send one wake-up in the current transaction of ``using`` (delivered on commit)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    payload = f"{kind}:{ident}"
    if len(payload.encode()) > MAX_PAYLOAD:
        payload = f"{kind}:*"  # too long to name: wake everyone listening for this kind
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])


def send_many(kind: str, idents: list[str], using: str) -> None:
    connection = connections[using]
    if connection.vendor != "postgresql" or not idents:
        return
    payloads = [f"{kind}:{i}" if len(i) < MAX_PAYLOAD - 4 else f"{kind}:*" for i in idents]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", [CHANNEL, payloads])
