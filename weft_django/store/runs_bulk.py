"""Creating many runs at once (``weft.start_many``): on PostgreSQL one statement per chunk of rows
(``unnest`` of parameter arrays), elsewhere ``create_run`` in a loop, always in the caller's transaction.

The PostgreSQL statement writes, for every row of the chunk, what the one-statement start of
``store.runs`` writes for one: the idempotency key (if any), the run, its unheld claim with a fresh
epoch (one ``nextval`` per row), its delayed-start timer (if any). A taken id or key inserts nothing
for that row (ON CONFLICT DO NOTHING waits for a concurrent inserter's transaction, as a unique
violation would) and never raises; the statement returns the ids it inserted. The wake-up follows
the commit, as for ``start`` (``store.runs.NOTIFY_AFTER_COMMIT``): one NOTIFY naming each new run
for a small call, else one ``w:*`` (every engine rescans once: one message instead of thousands).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from django.db import connections

from ..models import IdempotencyKey, Timer, Workflow, WorkflowClaim
from ..status import TimerKind, WorkflowStatus
from . import claims, notify
from .backend import backend
from .clock import workflow_now_sql
from .epochs import next_epoch_sql
from .runs import _CLAIM_COLUMNS, _KEY_COLUMNS, _RUN_GIVEN, _TIMER_COLUMNS, NewRun, create_run

# Rows per statement, and the bytes of input text one statement carries at most (a run bigger than
# that goes alone): a chunk of 2,000 inputs of 1 MiB each (PAYLOAD_MAX_BYTES allows it) passed
# PostgreSQL's 1 GB message limit and the server dropped the connection. A chunk's locks are taken in
# its rows' order (the caller sorts them, so concurrent calls lock in the same order).
CHUNK_ROWS = 2000
CHUNK_BYTES = 64 * 1024 * 1024
# Up to this many new runs in one call, one NOTIFY per run (an engine claims exactly those); above it
# one ``w:*`` (every engine rescans once).
NAMED_WAKEUPS_UP_TO = 32

_statements: dict[str, tuple[str, dict[str, Any]] | None] = {}


def create_runs(runs: Sequence[NewRun], using: str) -> set[str]:
    """Create these runs in the caller's transaction (join it: call inside ``atomic()`` when there
    is more than one chunk) and return the ids of those inserted; a run whose id or idempotency key
    is taken writes nothing (PostgreSQL) or only rolls back its own savepoint (elsewhere).

    Args:
        runs: plain starts (no schedule, parent or queue); ids and keys distinct within the call.
        using: the connection alias.

    Raises:
        django.db.DatabaseError: the database failed (the caller's transaction is then unusable).
    """
    if not runs:
        return set()
    if _statement(using) is None:
        return {new.workflow_id for new in runs if create_run(new, using) is not None}
    inserted: set[str] = set()
    for chunk in chunks_by_input(runs):
        inserted |= _insert_chunk(chunk, using)
    if inserted:
        wakeups = sorted(inserted) if len(inserted) <= NAMED_WAKEUPS_UP_TO else "*"
        notify.send_after_commit("w", wakeups, using)
    return inserted


class _WithInput(Protocol):
    input_text: str


RunT = TypeVar("RunT", bound=_WithInput)


def chunks_by_input(runs: Sequence[RunT]) -> Iterator[Sequence[RunT]]:
    """``runs`` in order, cut at CHUNK_ROWS rows or CHUNK_BYTES of input text, whichever comes first
    (new runs here, a parent's children in store/children.py)."""
    begin = size = 0
    for end, new in enumerate(runs):
        length = len(new.input_text)
        if end > begin and (end - begin >= CHUNK_ROWS or size + length > CHUNK_BYTES):
            yield runs[begin:end]
            begin, size = end, 0
        size += length
    yield runs[begin:]


def bulk_statement_applies(using: str) -> bool:
    """Whether ``create_runs`` writes in one statement per chunk here (PostgreSQL, current models)."""
    return _statement(using) is not None


def _insert_chunk(chunk: Sequence[NewRun], using: str) -> set[str]:
    statement = _statement(using)
    assert statement is not None
    sql, constants = statement
    after, at = [], []
    for new in chunk:
        after.append(None if new.delay is None or isinstance(new.delay, datetime) else new.delay)
        at.append(new.delay if isinstance(new.delay, datetime) else None)
    params: dict[str, Any] = {
        **constants,
        "ids": [new.workflow_id for new in chunk],
        "run_ids": [str(new.run_id or uuid.uuid4()) for new in chunk],
        "types": [new.workflow_type for new in chunk],
        "versions": [new.version for new in chunk],
        "inputs": [new.input_text for new in chunk],
        "keys": [new.idempotency_key for new in chunk],
        "after": after,
        "at": at,
        "timeouts": [new.execution_timeout for new in chunk],
        "traces": [new.trace_context for new in chunk],
        "queues": [new.queue for new in chunk],
        "priorities": [new.priority for new in chunk],
        "ckeys": [new.concurrency_key for new in chunk],
    }
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


def _statement(using: str) -> tuple[str, dict[str, Any]] | None:
    store = backend(using)
    if not store.writes_in_one_statement:
        return None
    if "chunk" not in _statements:
        _statements["chunk"] = _build(store.connection)
    return _statements["chunk"]


def _build(connection: Any) -> tuple[str, dict[str, Any]] | None:
    """The chunk statement and its constant parameters (the columns' defaults), or None when a model
    has a column it does not know how to fill (then the ORM path stays correct until it is updated)."""

    def columns(model: Any) -> set[str]:
        return {field.column for field in model._meta.concrete_fields}

    if (
        columns(WorkflowClaim) != _CLAIM_COLUMNS
        or columns(Timer) != _TIMER_COLUMNS
        or columns(IdempotencyKey) != _KEY_COLUMNS
    ):
        return None
    delayed = "b.b > b.t"
    waits = f"({delayed} OR b.queue IS NOT NULL)"  # a queued run is pending until admitted (store/queues.py)
    pending, running = f"'{WorkflowStatus.PENDING.value}'", f"'{WorkflowStatus.RUNNING.value}'"
    expressions = {
        "created_at": "b.t",
        "updated_at": "b.t",
        "status": f"CASE WHEN {waits} THEN {pending} ELSE {running} END",
        "started_at": f"CASE WHEN {waits} THEN NULL ELSE b.t END",
        "start_at": f"CASE WHEN {delayed} THEN b.b END",
        "execution_deadline": "CASE WHEN b.queue IS NULL THEN b.b + b.timeout END",  # queued: at admission
        "execution_timeout": "b.timeout",
    }
    constants: dict[str, Any] = {}
    names: list[str] = []
    values: list[str] = []
    for field in Workflow._meta.concrete_fields:
        names.append(connection.ops.quote_name(field.column))
        if field.attname in expressions:
            values.append(expressions[field.attname])
        elif field.attname in _RUN_GIVEN:
            values.append(f"b.{'id' if field.attname == 'id' else field.attname}")
        elif field.has_default() and not callable(field.default):
            if field.default is None:
                values.append("NULL")
            else:
                constants[f"d_{field.attname}"] = field.get_db_prep_save(field.default, connection)
                values.append(f"%(d_{field.attname})s")
        elif field.null and not field.has_default():
            values.append("NULL")
        else:
            return None
    inputs = (
        "unnest(%(ids)s::varchar[], %(run_ids)s::uuid[], %(types)s::varchar[], %(versions)s::varchar[], "
        "%(inputs)s::text[], %(keys)s::varchar[], %(after)s::interval[], %(at)s::timestamptz[], "
        "%(timeouts)s::interval[], %(traces)s::text[], %(queues)s::varchar[], %(priorities)s::integer[], "
        "%(ckeys)s::varchar[]) "
        "AS u(id, run_id, workflow_type, version, input, idempotency_key, after, at, timeout, trace_context, "
        "queue, priority, concurrency_key)"
    )
    sql = (
        f"WITH n AS MATERIALIZED (SELECT {workflow_now_sql('postgresql')} AS t), "
        f"b AS (SELECT u.*, n.t, CASE WHEN u.at IS NOT NULL THEN GREATEST(u.at, n.t) "
        f"WHEN u.after IS NOT NULL THEN n.t + u.after ELSE n.t END AS b FROM n, {inputs}), "
        f"k AS (INSERT INTO {IdempotencyKey._meta.db_table} (key, workflow_id, run_id, created_at, purged_at) "
        f"SELECT b.idempotency_key, b.id, b.run_id, b.t, NULL FROM b WHERE b.idempotency_key IS NOT NULL "
        f"ON CONFLICT DO NOTHING RETURNING key), "
        f"w AS (INSERT INTO {Workflow._meta.db_table} ({', '.join(names)}) SELECT {', '.join(values)} FROM b "
        f"WHERE b.idempotency_key IS NULL OR b.idempotency_key IN (SELECT key FROM k) "
        f"ON CONFLICT DO NOTHING RETURNING id, queue), "
        # a run waiting in a queue stays out of acquire's partial index until its admission
        f"{claims.unheld_claim_sql(epoch=next_epoch_sql('postgresql'), runnable='(w.queue IS NULL)')}, "
        f"s AS (INSERT INTO {Timer._meta.db_table} (workflow_id, run_id, kind, seq, attempt, fire_at) "
        f"SELECT b.id, b.run_id, '{TimerKind.DELAYED_START.value}', NULL, NULL, b.b FROM b JOIN w ON w.id = b.id "
        f"WHERE {delayed}) "
        "SELECT w.id FROM w"
    )
    return sql, constants
