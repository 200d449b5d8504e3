"""The fenced commit as ONE statement (PostgreSQL, ADR 0003): the writes of a commit (steps, consumed
signals, runs ending, their mailboxes, timers and claims, the ``r:`` wake-ups) as data-modifying CTEs
of one statement, and, outside any transaction, the fence itself as its first CTE. Used by
``store.commit`` where ``backend(using).batches_statements``."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from django.db import DatabaseError

from ..models import Step, Timer, Workflow
from ..status import ACTIVE_STATUSES, SignalState, UpdateStatus
from . import prepared
from .backend import backend
from .claims import FENCE_CTE, release_cte_sql
from .mailbox import BUFFERED_STATE_SQL, SIGNAL_TABLE, TAKEN_ERROR_JSON, TERMINAL_ERROR_JSON, UPDATE_TABLE
from .notify import CARRIED_STATUSES, CHANNEL, MAX_PAYLOAD
from .sessions import COMMIT_LOCK_WAIT_SQL
from .writes import WorkflowWrites, latest_per_seq

STEP_TABLE = Step._meta.db_table
WORKFLOW_TABLE = Workflow._meta.db_table
TIMER_TABLE = Timer._meta.db_table
_STEP_COLUMNS = (
    "workflow_id",
    "run_id",
    "seq",
    "kind",
    "name",
    "status",
    "result",
    "error",
    "attempts",
    "epoch",
    "started_at",
    "completed_at",
)
_STEP_TYPES = (
    "text",
    "uuid",
    "int",
    "text",
    "text",
    "text",
    "text",
    "jsonb",
    "int",
    "bigint",
    "timestamptz",
    "timestamptz",
)
_STEP_KEPT = ("workflow_id", "run_id", "seq", "started_at")  # an upsert keeps the key and when the step began
_MAILBOX_ERROR = TERMINAL_ERROR_JSON
# The step upsert: each row of the document's ``s`` array unpacked by position into its column.
_STEPS_CTE = (
    f"steps AS (INSERT INTO {STEP_TABLE} ({', '.join(_STEP_COLUMNS)}) SELECT "
    + ", ".join(
        f"NULLIF(x->{i}, 'null')" if kind == "jsonb" else f"(x->>{i})::{kind}" for i, kind in enumerate(_STEP_TYPES)
    )
    + " FROM d, jsonb_array_elements(d.j->'s') AS x ON CONFLICT (run_id, seq) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _STEP_COLUMNS if c not in _STEP_KEPT)
    + ")"
)


@functools.cache  # models do not change while the process runs; asked on every commit
def step_columns_known() -> bool:
    """The raw step upsert names every column but the key: a new column falls back to the ORM path."""
    return {f.column for f in Step._meta.concrete_fields} == {"id", *_STEP_COLUMNS}


# The fence of the one-statement commit: lock our claims at our epochs first (``f``), find the runs
# ending with active children (``k``: left to the general path), then rebuild the document ``d`` with
# only the rows of workflows the fence locked and ``k`` does not name. Every write CTE reads ``d``.
_FENCED_ROWS = (("s", "x->>0"), ("c", "x->>2"), ("e", "x->>0"), ("r", "x #>> '{}'"))  # key, its workflow id
_FENCE_START = f"raw AS (SELECT %s::jsonb AS j), {FENCE_CTE}, "
# ``k`` when a finishing run may have children (``p``: their ids; WorkflowWrites.started_children,
# as the general path reads it). Otherwise ``k`` is empty without a lookup (before prepared.KEYED_PLAN
# its generic plan seq-scanned the workflow table whatever the array held: 0.3 ms at 1,200 workflows,
# on every fenced commit).
_K_PARENTS = (
    f"k AS MATERIALIZED (SELECT DISTINCT parent_id AS workflow_id FROM {WORKFLOW_TABLE} WHERE parent_id = "
    "ANY(ARRAY(SELECT x #>> '{}' FROM raw, jsonb_array_elements(raw.j->'p') x)) "
    f"AND status IN ({', '.join(['%s'] * len(ACTIVE_STATUSES))})), "
)
_K_NONE = "k AS (SELECT NULL::text AS workflow_id WHERE FALSE), "
_FENCE_END = (
    "ok AS MATERIALIZED (SELECT ARRAY(SELECT workflow_id FROM f EXCEPT SELECT workflow_id FROM k) AS ids), "
    "d AS MATERIALIZED (SELECT jsonb_build_object("
    + ", ".join(
        f"'{key}', (SELECT COALESCE(jsonb_agg(x), '[]'::jsonb) FROM jsonb_array_elements(raw.j->'{key}') x "
        f"WHERE {column} = ANY(ok.ids))"
        for key, column in _FENCED_ROWS
    )
    + ") AS j FROM raw, ok)"
)


# Above this many workflows a commit takes the general path: the saved round trips are then shared by
# the whole batch anyway, and one statement carrying a big batch measured several times slower than
# lock + writes (1,000 three-step workflows from one client: the engine fell 1.5 s behind at 200-workflow
# batches, and kept up at 16 and 32; benchmarks/peer_apps/weft_bench.py (a)).
ONE_STATEMENT_MAX_WORKFLOWS = 16


def fits_one_statement(batch: list[WorkflowWrites], using: str) -> bool:
    """Whether this commit can be ONE autocommit statement that takes the fence itself (PostgreSQL,
    outside any transaction): a small batch (ONE_STATEMENT_MAX_WORKFLOWS) that writes only steps,
    consumed signals and terminal states of runs that are nobody's child. Updates, timers, stuck
    flags, children and guarded steps (checked after the fence) keep the general path."""
    found = backend(using)
    if not found.batches_statements or found.connection.in_atomic_block or not step_columns_known():
        return False
    if not found.joins_statements:  # its settings go in the statement's own query string
        return False
    if len(batch) > ONE_STATEMENT_MAX_WORKFLOWS:
        return False
    return all(
        not (
            w.updates_done
            or w.applied
            or w.update_responses
            or w.timers_add
            or w.timers_delete
            or w.stuck
            or w.clear_stuck
            or w.children
            or w.parent
            or w.continued
            or w.guards
        )
        for w in batch
    )


def commit_in_one_statement(
    engine_id: str, batch: list[WorkflowWrites], now: datetime, using: str
) -> tuple[set[str], set[str]]:
    """The fenced commit as one autocommit statement: its first CTE locks the claims still held at
    these epochs (FOR NO KEY UPDATE, in workflow_id order, re-checked against the newest row version
    as any READ COMMITTED lock is) and every write reads its rows through that CTE, so nothing lands
    for a claim that is not ours; the locks last until the statement's own commit. One round trip
    instead of four (BEGIN, lock, write, COMMIT). Returns (claims held, held runs deferred to the
    general path: finishing runs with active children, whose closing needs more statements)."""
    rows = run_write_statement(engine_id, batch, now, using, fence=True)
    held = {value for kind, value in rows if kind == "f"}
    return held, held & {value for kind, value in rows if kind == "k"}


def run_write_statement(
    engine_id: str, batch: list[WorkflowWrites], now: datetime, using: str, *, fence: bool
) -> list[tuple[str, str]]:
    """Build and run the write statement; returns its (kind, value) rows: ``p`` a finished run with
    active children; with ``fence`` also ``f`` a claim locked at our epoch and ``k`` a finished run
    with active children whose writes were left out."""
    finished = [w for w in batch if w.finish is not None]
    consumed = [[pk, seq, w.workflow_id] for w in batch for pk, seq in w.signals_consumed]
    released = sorted(w.workflow_id for w in batch if w.finish is not None or w.stuck is not None)
    steps = [
        [
            w.workflow_id,
            w.run_id,
            s.seq,
            s.kind,
            s.name,
            s.status,
            s.result,
            s.error,
            s.attempts,
            w.epoch,
            (s.started_at or now).isoformat(),
            (s.completed_at or now).isoformat() if s.completed_at or s.settled else None,
        ]
        for w in batch
        for s in latest_per_seq(w.steps)
    ]
    # Every row of the statement travels in ONE jsonb parameter (json.dumps is C; quoting a few
    # hundred array elements one by one in the client-side binding is not), unpacked by position.
    document = {
        "s": steps,
        "c": consumed,
        # [id, status, result, error, run_id]: also the R: wake-up's payload (notify.ended_payload)
        "e": [
            [w.workflow_id, w.finish.status, w.finish.result, w.finish.error, w.run_id] for w in finished if w.finish
        ],
        "r": released,
    }
    parents = [w.workflow_id for w in finished if w.started_children]
    if fence:
        document["f"] = [[w.workflow_id, w.epoch] for w in batch]  # the claims the fence locks
        if parents:
            document["p"] = parents  # finishing runs that may have children (k)
    ids = "ARRAY(SELECT jsonb_array_elements_text(d.j->'{key}') FROM d)"
    ended_ids = "ARRAY(SELECT x->>0 FROM d, jsonb_array_elements(d.j->'e') AS x)"
    consumed_ids = "ARRAY(SELECT (x->>0)::bigint FROM d, jsonb_array_elements(d.j->'c') AS x)"
    active = ", ".join(["%s"] * len(ACTIVE_STATUSES))
    params: list[Any] = [json.dumps(document)]
    if fence:
        ctes = [_FENCE_START + (_K_PARENTS if parents else _K_NONE) + _FENCE_END]
        params.append(engine_id)
        if parents:
            params.extend(sorted(ACTIVE_STATUSES))
    else:
        ctes = ["d AS (SELECT %s::jsonb AS j)"]
    if steps:
        ctes.append(_STEPS_CTE)
    if consumed:
        ctes.append(
            f"consumed AS (UPDATE {SIGNAL_TABLE} AS s SET state = %s, consumed_seq = (x->>1)::int "
            f"FROM d, jsonb_array_elements(d.j->'c') AS x WHERE s.id = (x->>0)::bigint AND s.id = ANY({consumed_ids}))"
        )
        params.append(SignalState.CONSUMED)
    if finished:
        ctes.append(
            f"ended AS (UPDATE {WORKFLOW_TABLE} AS w SET status = x->>1, result = x->>2, "
            f"error = NULLIF(x->3, 'null'), finished_at = %s, updated_at = %s, current_step = '' "
            f"FROM d, jsonb_array_elements(d.j->'e') AS x WHERE w.id = x->>0 AND w.id = ANY({ended_ids}))"
        )
        # (the redundant ANY lets the generic plan take the primary key, not hash a seq scan of workflows)
        params.extend([now, now])
        # The terminal commit closes the mailbox: unconsumed signals are dropped (not those this very
        # commit consumes), admitted updates fail, timers go.
        ctes.append(  # the state written in: a generic plan keeps the partial index on buffered signals
            f"dropped AS (UPDATE {SIGNAL_TABLE} SET state = %s WHERE workflow_id = ANY({ended_ids}) "
            f"AND {BUFFERED_STATE_SQL} AND NOT (id = ANY({consumed_ids})))"
        )
        params.append(SignalState.DROPPED)
        ctes.append(
            f"failed AS (UPDATE {UPDATE_TABLE} SET status = %s, completed_at = %s, "
            f"error = CASE WHEN status = %s THEN %s::jsonb ELSE %s::jsonb END "
            f"WHERE workflow_id = ANY({ended_ids}) AND status IN (%s, %s))"
        )
        params.extend([UpdateStatus.FAILED, now, UpdateStatus.ACCEPTED, TAKEN_ERROR_JSON, _MAILBOX_ERROR])
        params.extend([UpdateStatus.ADMITTED, UpdateStatus.ACCEPTED])
        ctes.append(f"timers AS (DELETE FROM {TIMER_TABLE} WHERE workflow_id = ANY({ended_ids}))")
    if released:
        # The fence locked these claims at our epochs in this transaction: clear the holder, keep the
        # epoch; a run that ends is no longer runnable (out of acquire's partial index).
        runnable = f"NOT (workflow_id = ANY({ended_ids}))" if finished else "TRUE"
        ctes.append(release_cte_sql(ids.format(key="r"), runnable))
        params.append(engine_id)
    # The main query sends the r: wake-ups (delivered at commit) and finds the finished runs with
    # active children. It reads the snapshot from before this statement: a child ending in this
    # very commit still looks active, and close_children re-reads it (a false positive is harmless).
    parts = []
    if finished:
        parts.append(
            # The outcome rides in the payload when it fits (notify.ended_payload, the same text).
            f"SELECT 'n', pg_notify(%s, CASE WHEN x->>1 IN ({', '.join(['%s'] * len(CARRIED_STATUSES))}) "
            "AND octet_length(x::text) <= %s "
            "THEN 'R:' || x::text ELSE 'r:' || (x->>0) END)::text "
            "FROM d, jsonb_array_elements(d.j->'e') AS x WHERE octet_length(x->>0) < %s"
        )
        params.extend([CHANNEL, *CARRIED_STATUSES, MAX_PAYLOAD - 2, MAX_PAYLOAD - 2])
        if not fence:
            parts.append(
                f"SELECT 'p', parent_id FROM {WORKFLOW_TABLE} WHERE parent_id = ANY({ended_ids}) "
                f"AND status IN ({active})"
            )
            params.extend(sorted(ACTIVE_STATUSES))
    if fence:
        parts.extend(["SELECT 'f', workflow_id FROM f", "SELECT 'k', workflow_id FROM k"])
    if len(ctes) == 1 and not parts:
        return []
    main = " UNION ALL ".join(parts) if parts else "SELECT NULL, NULL"
    connection = backend(using).connection
    sql = f"WITH {', '.join(ctes)} {main}"
    with connection.cursor() as cursor:
        # Prepared (its planning costs more than its run) when it is its own transaction: the fence
        # path, where it runs after prepared.KEYED_PLAN in the same query string (its plan, made once,
        # must not depend on how small the tables were then).
        if fence:
            plan = [(setting, None) for setting in (*prepared.KEYED_PLAN, COMMIT_LOCK_WAIT_SQL)]
            prepared.execute_statements(cursor, connection, [*plan, (sql, params)])
            if not all(cursor.nextset() for _ in plan):  # past the SETs: the statement's rows
                raise DatabaseError("the fenced commit returned no rows")
        else:
            prepared.execute(cursor, connection, sql, params)
        return [(kind, value) for kind, value in cursor.fetchall() if kind is not None]
