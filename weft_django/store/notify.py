"""Wake-ups. On PostgreSQL a NOTIFY sent inside a transaction is delivered when it commits (and not at
all if it rolls back), so a wake-up can never overtake the row it announces. Elsewhere engines poll.
Starts send theirs after their commit instead (``send_after_commit``; ``store.runs.NOTIFY_AFTER_COMMIT``;
in autocommit in the same round trip as the start, ``store.runs.NOTIFY_PIPELINED``).

Payloads: ``w:<workflow_id>`` (a workflow needs attention: new, signalled, updated, transitioned),
``S:<json [id, workflow_id, run_id, name, payload, trace_context]>`` (a signal was buffered: the row
itself, so the engine holding a parked workflow consumes it without reading its mailbox; a signal
over ``MAX_CARRIED_SIGNAL`` bytes sends ``w:`` instead; engine/signal_delivery.py says when a
carried row is used),
``q:<engine_id>`` (a query waits for that engine), ``r:<workflow_id>`` (a run or update finished:
callers waiting for a result), ``R:<json [workflow_id, status, result, error, run_id]>`` (a run completed, its
outcome carried in the payload, so a waiting ``result()`` returns without reading the row; sent
instead of ``r:`` when it fits in ``MAX_PAYLOAD``. Not for a failure: ``retry()`` runs a failed run
again under the same run id, so a failure's wake-up, heard late, would name the very run a waiter
started after the retry saw running).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.db import DatabaseError, connections, transaction

from .backend import backend

logger = logging.getLogger("weft_django.store")
CHANNEL = "weft"
MAX_PAYLOAD = 7900  # PostgreSQL refuses NOTIFY payloads of 8000 bytes or more
# The largest S: wake-up (a signal's row). Every listener on the channel receives every wake-up, and
# PostgreSQL's notification queue is shared by the whole cluster: a bigger signal sends w: (its
# engine then reads the row) rather than filling that queue a page per signal.
MAX_CARRIED_SIGNAL = 1000


def send(kind: str, ident: str, using: str) -> None:
    """Send one wake-up in the current transaction of ``using`` (delivered on commit).

    Args:
        kind: the payload's kind (``w``, ``q``, ``r``, ``a``, ``c``).
        ident: what it names (a workflow id, an engine id, ``*``: everyone of that kind).
        using: the connection alias. Nothing is sent where the database has no LISTEN/NOTIFY.
    """
    store = backend(using)
    if not store.listens:
        return
    connection = store.connection
    payload = f"{kind}:{ident}"
    if len(payload.encode()) > MAX_PAYLOAD:
        payload = f"{kind}:*"  # too long to name: wake everyone listening for this kind
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])


def send_after_commit(kind: str, ident: str | list[str], using: str) -> None:
    """Send a wake-up (one per ident of a list, in one statement) once the current transaction of
    ``using`` commits, in a transaction of its own (at once in autocommit; nothing if it rolls back).
    Such a transaction writes no WAL and commits without waiting for a flush, so it holds
    PostgreSQL's notification-queue lock only briefly (``store.runs.NOTIFY_AFTER_COMMIT``). A failure
    to send is logged, never raised: the row is committed already and the engines' poll finds it."""
    store = backend(using)
    if not store.listens:
        return

    def fire() -> None:
        try:
            if isinstance(ident, str):
                send(kind, ident, using)
            else:
                send_many(kind, ident, using)
        except DatabaseError:
            logger.warning("weft wake-up not sent (the engines' poll finds the run) kind=%s ident=%s", kind, ident)

    if store.connection.in_atomic_block:
        transaction.on_commit(fire, using=using)
    else:
        fire()


# A buffered signal as the engine reads it: (id, workflow id, run id, name, payload, trace context).
BufferedRow = tuple[int, str, Any, str, str, str | None]


def parse_signal(body: str) -> BufferedRow | None:
    """The buffered-signal row an ``S:`` payload's body carries (what follows ``S:``), or None when
    it is not one (the engine then reads the mailbox)."""
    try:
        pk, workflow_id, run_id, name, payload, trace_context = json.loads(body)
    except (ValueError, TypeError):
        return None
    texts = (workflow_id, run_id, name, payload)
    if not isinstance(pk, int) or not all(isinstance(t, str) for t in texts):
        return None
    if trace_context is not None and not isinstance(trace_context, str):
        return None
    return pk, workflow_id, run_id, name, payload, trace_context


# The end whose outcome an R: payload carries: the one no transition undoes under the same run id (a
# failed run may be retried; its waiters read the row).
CARRIED_STATUSES = ("completed",)


def ended_payload(workflow_id: str, status: str, result: str | None, error: Any, run_id: str) -> str:
    """The wake-up of a run that ended: ``R:`` with its outcome when it fits (and the status is one
    ``CARRIED_STATUSES`` names), else ``r:<workflow_id>`` (the waiter reads the row)."""
    if status in CARRIED_STATUSES:
        payload = "R:" + json.dumps([workflow_id, status, result, error, run_id], separators=(",", ":"))
        if len(payload.encode()) <= MAX_PAYLOAD:
            return payload
    return f"r:{workflow_id}"


def parse_ended(body: str) -> tuple[str, dict[str, Any]] | None:
    """The (workflow id, terminal fields as ``runs.read_end`` gives them) of an ``R:`` payload's body
    (what follows ``R:``), or None when it is not one (a waiter then reads the row)."""
    try:
        workflow_id, status, result, error, run_id = json.loads(body)
    except (ValueError, TypeError):
        return None
    if not isinstance(workflow_id, str) or status not in CARRIED_STATUSES:
        return None
    fields = {
        "status": status,
        "result": result,
        "error": error,
        "cancel_reason": None,
        "execution_deadline": None,
        "created_at": None,  # (a waiter takes a carried end only for the run its last read saw)
    }
    return workflow_id, {**fields, "run_id": run_id}


def send_ended(ended: list[tuple[str, str, str | None, Any, str]], using: str) -> None:
    """Send the wake-ups of these ended runs ((id, status, result, error, run_id)), one statement (see
    ``ended_payload``; an id too long to name wakes every result waiter)."""
    store = backend(using)
    if not store.listens or not ended:
        return
    payloads = [
        ended_payload(wid, status, result, error, run_id) if len(wid) < MAX_PAYLOAD - 4 else "r:*"
        for wid, status, result, error, run_id in ended
    ]
    with store.connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", [CHANNEL, payloads])


def send_many(kind: str, idents: list[str], using: str) -> None:
    """Send one wake-up per ident in one statement (as ``send``; nothing for an empty list)."""
    store = backend(using)
    if not store.listens or not idents:
        return
    connection = store.connection
    payloads = [f"{kind}:{i}" if len(i) < MAX_PAYLOAD - 4 else f"{kind}:*" for i in idents]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", [CHANNEL, payloads])


# -- client side: the LISTEN connection of the weft-wait threads (result, query, update) ----------


def connect(alias: str) -> Any:
    """A new autocommit psycopg connection with the settings of Django's ``alias`` (outside Django's
    connection handling: a LISTEN connection, or the reader of ``result()``)."""
    import psycopg

    params = dict(connections[alias].get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(**params, autocommit=True)


def listen(conn: Any) -> None:
    """LISTEN on weft's channel on ``conn`` (from ``connect``)."""
    conn.execute(f"LISTEN {CHANNEL}")


def open_reader(alias: str) -> Any:
    """A connection (from ``connect``) for reads whose datetimes come back in UTC, as Django's do."""
    reader = connect(alias)
    reader.execute("SET TIME ZONE 'UTC'")
    return reader
