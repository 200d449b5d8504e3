"""fenced_commit: the ONLY way an engine writes workflow-scoped state.

One transaction whose first statement locks, in workflow_id order, the claim rows that match
(workflow_id, epoch, engine_id) = (id, my epoch, me). A takeover's UPDATE and every external
transition lock the same row, so they wait for us or we for them: a write lands only under the
current epoch. Workflows whose row did not come back are re-read (another epoch = deposed, no holder =
released) and their writes dropped; the rest commit together (one fsync for many workflows' steps).

On PostgreSQL the common commit (steps, consumed signals, runs ending) is ONE autocommit statement
whose first CTE takes that same lock and whose writes read their rows through it (one round trip
instead of four); everything else takes the general path (ADR 0003).

On SQLite, IMMEDIATE transactions take the write lock at BEGIN, so the plain read is the fence.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from .. import prepared
from ..models import BufferedSignal, PendingUpdate, Step, Timer, Workflow
from ..notify import CHANNEL, MAX_PAYLOAD, send_many
from ..status import ACTIVE_STATUSES, SignalState, UpdateStatus
from ..transitions import active_descendants, close_children
from . import sessions
from .children import ChildStart, report_child_end, start_children
from .driver import AppliedRecord, StepRecord

logger = logging.getLogger(__name__)
CLAIM_TABLE = "weft_django_workflowclaim"


@dataclasses.dataclass
class Finish:
    status: str  # a terminal status
    result: str | None = None
    error: dict[str, Any] | None = None


@dataclasses.dataclass
class WorkflowWrites:
    """Everything one workflow wants committed in the next fenced commit."""

    workflow_id: str
    run_id: str
    epoch: int
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    timers_add: list[Timer] = dataclasses.field(default_factory=list)
    timers_delete: list[int] = dataclasses.field(default_factory=list)
    signals_consumed: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (signal pk, seq)
    finish: Finish | None = None
    stuck: dict[str, Any] | None = None  # {"error": {...}, "retry_at": datetime}
    children: list[ChildStart] = dataclasses.field(default_factory=list)
    parent: tuple[str, str, int] | None = None  # (parent id, parent run id, parent seq): told when we end
    clear_stuck: bool = False
    # Messages (engine/messages.py): admitted updates settled under this fence, the applied-update log
    # replay re-applies, and respond() answers of wait_for_update (update id, codec text of the result).
    updates_done: list[UpdateDone] = dataclasses.field(default_factory=list)
    applied: list[AppliedRecord] = dataclasses.field(default_factory=list)
    update_responses: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.steps
            or self.updates_done
            or self.applied
            or self.update_responses
            or self.timers_add
            or self.timers_delete
            or self.signals_consumed
            or self.finish
            or self.stuck
            or self.clear_stuck
        )


@dataclasses.dataclass
class FenceResult:
    committed: set[str]
    lost: dict[str, str]  # workflow id -> "deposed" | "released" | "missing"
    children: dict[str, int] = dataclasses.field(default_factory=dict)  # children started: id -> epoch
    # Still ours, but a row the commit needed (the claim, or a child's claim that a finishing run
    # closes) was locked by another transaction: nothing of theirs was written; retry next pass.
    busy: set[str] = dataclasses.field(default_factory=set)


def lock_claims(engine_id: str, epochs: dict[str, int], using: str, *, wait: bool = True) -> set[str]:
    """Inside a transaction: lock the claims still held at these epochs; return their workflow ids.

    ``wait=False`` (the engine's batch commits): a claim row another transaction has locked (a user's
    open transaction around ``cancel()``, a takeover, our own renewal) is skipped, not waited for; its
    workflow is not in the result, and :func:`classify_unheld` tells it apart from a lost claim."""
    connection = connections[using]
    ids = sorted(epochs)
    if not ids:
        return set()
    lock = ""
    if connection.vendor == "postgresql":
        lock = " FOR NO KEY UPDATE" if wait else " FOR NO KEY UPDATE SKIP LOCKED"
    held: set[str] = set()
    with connection.cursor() as cursor:
        for chunk in _chunks(ids, 500):
            placeholders = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"SELECT workflow_id, epoch FROM {CLAIM_TABLE} WHERE engine_id = %s AND workflow_id IN ({placeholders})"
                f" ORDER BY workflow_id{lock}",
                [engine_id, *chunk],
            )
            held.update(wid for wid, epoch in cursor.fetchall() if epochs[wid] == epoch)
    return held


def lock_batch_and_family(
    engine_id: str, epochs: dict[str, int], family: set[str], using: str
) -> tuple[set[str], set[str]]:
    """Inside a transaction, ONE statement in workflow_id order: lock our claims at these epochs and
    the claims of ``family`` (the active descendants that finishing runs close, whoever holds them),
    skipping rows another transaction holds. Returns (our claims held, family claims locked)."""
    connection = connections[using]
    ids = sorted(set(epochs) | family)
    if not ids:
        return set(), set()
    lock = " FOR NO KEY UPDATE SKIP LOCKED" if connection.vendor == "postgresql" else ""
    rows: list[tuple[str, int, str | None]] = []
    with connection.cursor() as cursor:
        placeholders = ", ".join(["%s"] * len(ids))
        cursor.execute(
            f"SELECT workflow_id, epoch, engine_id FROM {CLAIM_TABLE} WHERE workflow_id IN ({placeholders})"
            f" ORDER BY workflow_id{lock}",
            ids,
        )
        rows = cursor.fetchall()
    held = {wid for wid, epoch, holder in rows if wid in epochs and (epoch, holder) == (epochs[wid], engine_id)}
    return held, {wid for wid, _, _ in rows if wid in family}


def classify_unheld(engine_id: str, epochs: dict[str, int], using: str) -> tuple[dict[str, str], set[str]]:
    """For claims a fence did not get: (lost, busy). ``lost`` maps a workflow id to "deposed",
    "released" or "missing"; ``busy`` holds those still ours at our epoch, whose row another
    transaction had locked (their writes wait for the next pass)."""
    if not epochs:
        return {}, set()
    ids = sorted(epochs)
    with connections[using].cursor() as cursor:
        placeholders = ", ".join(["%s"] * len(ids))
        cursor.execute(
            f"SELECT workflow_id, engine_id, epoch FROM {CLAIM_TABLE} WHERE workflow_id IN ({placeholders})",
            ids,
        )
        rows = {wid: (holder, epoch) for wid, holder, epoch in cursor.fetchall()}
    lost: dict[str, str] = {}
    busy: set[str] = set()
    for wid in ids:
        if wid not in rows:
            lost[wid] = "missing"
        elif rows[wid] == (engine_id, epochs[wid]):
            busy.add(wid)
        else:
            lost[wid] = "released" if rows[wid][0] is None else "deposed"
    return lost, busy


def why_lost(engine_id: str, workflow_ids: list[str], using: str) -> dict[str, str]:
    with connections[using].cursor() as cursor:
        placeholders = ", ".join(["%s"] * len(workflow_ids))
        cursor.execute(
            f"SELECT workflow_id, engine_id FROM {CLAIM_TABLE} WHERE workflow_id IN ({placeholders})",
            workflow_ids,
        )
        rows = dict(cursor.fetchall())
    return {
        wid: "missing" if wid not in rows else ("released" if rows[wid] is None else "deposed") for wid in workflow_ids
    }


def fenced_commit(
    engine_id: str, batch: list[WorkflowWrites], now: datetime, using: str, claim_ttl: timedelta | None = None
) -> FenceResult:
    """Commit every workflow's writes whose claim this engine still holds at the stated epoch.

    The fence never waits for a row another transaction holds (SKIP LOCKED): such a workflow is
    returned in ``busy`` with nothing written, so one user transaction holding one claim cannot stall
    the rest of the batch; the engine carries its writes to the next pass."""
    batch = [writes for writes in batch if not writes.empty]
    if not batch:
        return FenceResult(set(), {})
    epochs = {writes.workflow_id: writes.epoch for writes in batch}
    ttl = claim_ttl or timedelta(seconds=30)
    held: set[str] = set()
    busy: set[str] = set()
    children: dict[str, int] = {}
    if _fits_one_statement(batch, using):
        held, deferred = _commit_in_one_statement(engine_id, batch, now, using)
        batch = [writes for writes in batch if writes.workflow_id in deferred]
        held -= deferred
    if batch:  # the general path: lock (one sorted statement), then write, in one transaction
        with transaction.atomic(using=using):
            locked, families_busy = _lock_general(engine_id, batch, using)
            kept = [w for w in batch if w.workflow_id in locked and w.workflow_id not in families_busy]
            if kept:
                children = _apply(engine_id, kept, now, using, ttl)
        held |= locked - families_busy
        busy |= families_busy
    lost, skipped = classify_unheld(engine_id, {wid: e for wid, e in epochs.items() if wid not in held | busy}, using)
    busy |= skipped
    for wid, reason in lost.items():
        logger.warning(
            "fenced commit refused workflow=%s engine=%s epoch=%s reason=%s", wid, engine_id, epochs[wid], reason
        )
    if busy:
        logger.info(
            "fenced commit deferred (rows locked by another transaction) engine=%s workflows=%s",
            engine_id,
            sorted(busy),
        )
    return FenceResult(held, lost, children, busy)


def _lock_general(engine_id: str, batch: list[WorkflowWrites], using: str) -> tuple[set[str], set[str]]:
    """The general path's fence: our claims, plus the claims of the active descendants that the
    batch's finishing runs close, in one sorted statement that skips locked rows. Returns (our claims
    held, finishing runs whose family could not be locked whole: left for the next pass)."""
    epochs = {w.workflow_id: w.epoch for w in batch}
    ending = {w.workflow_id: w.run_id for w in batch if w.finish is not None}
    families = active_descendants(ending, using) if ending else {}
    members = {child for family in families.values() for child in family}
    if not members:
        return lock_claims(engine_id, epochs, using, wait=False), set()
    held, locked = lock_batch_and_family(engine_id, epochs, members, using)
    busy = {root for root, family in families.items() if root in held and not family <= locked}
    # A child started between the read and the lock (its parent's commit) is not locked: look again.
    again = active_descendants({root: ending[root] for root in families if root in held}, using)
    busy |= {root for root, family in again.items() if not family <= locked}
    return held, busy


def _close_families(
    engine_id: str,
    batch: list[WorkflowWrites],
    finished: list[WorkflowWrites],
    with_children: set[str],
    now: datetime,
    claim_ttl: timedelta,
    using: str,
) -> dict[str, int]:
    """After both commit paths' writes: close the children of finished runs, tell their parents, and
    start the children the batch asked for. Returns the started children's claims."""
    for w in finished:
        assert w.finish is not None
        if w.workflow_id in with_children:
            close_children(w.workflow_id, w.run_id, w.finish.status, using)
        if w.parent is not None:
            report_child_end(w.workflow_id, *w.parent, w.finish.status, w.finish.result, w.finish.error, now, using)
    starts = [child for w in batch if w.finish is None for child in w.children]
    return start_children(engine_id, starts, now, claim_ttl, using) if starts else {}


def _write_timers_and_stuck(batch: list[WorkflowWrites], now: datetime, using: str) -> None:
    """The rare parts both commit paths write with the ORM: timers added or deleted, stuck flags."""
    timers = [t for w in batch for t in w.timers_add]
    if timers:
        Timer.objects.using(using).bulk_create(timers)  # their pks are needed (a later delete by pk)
    doomed = [pk for w in batch for pk in w.timers_delete]
    if doomed:
        Timer.objects.using(using).filter(pk__in=doomed).delete()
    for w in batch:
        if w.stuck is not None:
            Workflow.objects.using(using).filter(pk=w.workflow_id).update(
                stuck_error=w.stuck["error"],
                stuck_retry_at=w.stuck["retry_at"],
                stuck_attempts=w.stuck["attempts"],
                updated_at=now,
            )
        elif w.clear_stuck:
            Workflow.objects.using(using).filter(pk=w.workflow_id).update(
                stuck_error=None, stuck_retry_at=None, stuck_attempts=0
            )


def _apply(
    engine_id: str, batch: list[WorkflowWrites], now: datetime, using: str, claim_ttl: timedelta
) -> dict[str, int]:
    if connections[using].vendor == "postgresql" and _step_columns_known():
        return _apply_postgresql(engine_id, batch, now, using, claim_ttl)
    write_steps(batch, now, using)
    apply_messages(batch, now, using)  # before the mailbox closes: a respond() in a terminal commit answers
    _write_timers_and_stuck(batch, now, using)
    for w in batch:
        for signal_pk, seq in w.signals_consumed:
            BufferedSignal.objects.using(using).filter(pk=signal_pk).update(
                state=SignalState.CONSUMED, consumed_seq=seq
            )
    finished = [w for w in batch if w.finish is not None]
    if finished:  # one UPDATE for every run this commit ends
        Workflow.objects.using(using).bulk_update(
            [
                Workflow(
                    id=w.workflow_id,
                    status=w.finish.status,
                    result=w.finish.result,
                    error=w.finish.error,
                    finished_at=now,
                    updated_at=now,
                    current_step="",
                )
                for w in finished
                if w.finish is not None
            ],
            ["status", "result", "error", "finished_at", "updated_at", "current_step"],
        )
    released = [w.workflow_id for w in batch if w.finish is not None or w.stuck is not None]
    if finished:
        _close_mailboxes([w.workflow_id for w in finished], now, using)
    if released:
        release_locked_claims(engine_id, released, using, ended=[w.workflow_id for w in finished])
        send_many("r", [w.workflow_id for w in finished], using)
    with_children = _with_active_children([w.workflow_id for w in finished], using) if finished else set()
    return _close_families(engine_id, batch, finished, with_children, now, claim_ttl, using)


# -- PostgreSQL: the writes of a commit in one statement -------------------------------------------
STEP_TABLE = Step._meta.db_table
WORKFLOW_TABLE = Workflow._meta.db_table
SIGNAL_TABLE = BufferedSignal._meta.db_table
UPDATE_TABLE = PendingUpdate._meta.db_table
TIMER_TABLE = Timer._meta.db_table
# Written into SQL, not a parameter: a prepared statement's generic plan can then use the partial
# index on buffered signals (weft_signal_buffered).
BUFFERED_STATE_SQL = f"state = '{SignalState.BUFFERED.value}'"
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
_MAILBOX_ERROR = json.dumps(
    {"type": "WorkflowTerminalError", "message": "The workflow ended before the update was applied."}
)
# Issue 20: an update a wait_for_update took (accepted) was consumed, not left unapplied.
_TAKEN_ERROR = {
    "type": "WorkflowTerminalError",
    "message": "The workflow took the update (wait_for_update) but ended before it answered it (no respond()).",
    "accepted": True,
}


def _step_columns_known() -> bool:
    """The raw step upsert names every column but the key: a new column falls back to the ORM path."""
    return {f.column for f in Step._meta.concrete_fields} == {"id", *_STEP_COLUMNS}


def _apply_postgresql(
    engine_id: str, batch: list[WorkflowWrites], now: datetime, using: str, claim_ttl: timedelta
) -> dict[str, int]:
    """As ``_apply``, with the common writes (steps, consumed signals, finished runs, their mailboxes,
    timers and claims, the ``r:`` wake-ups) in ONE statement of data-modifying CTEs, instead of one
    ORM statement each. The rare parts (updates, whose settlement must check its row count; timers;
    stuck runs; children) keep their own statements, before it or after it.

    All CTEs of one statement see the same snapshot and no row may be modified twice in it, so: the
    signals a finishing run consumes are excluded from the drop of its mailbox; everything the rare
    parts write first (timers added or deleted, stuck flags, update settlements) is visible to it."""
    apply_messages(batch, now, using)  # before the mailbox closes: a respond() in a terminal commit answers
    _write_timers_and_stuck(batch, now, using)
    finished = [w for w in batch if w.finish is not None]
    rows = _run_write_statement(engine_id, batch, now, using, fence=False)
    with_children = {value for kind, value in rows if kind == "p"}
    return _close_families(engine_id, batch, finished, with_children, now, claim_ttl, using)


# The fence of the one-statement commit: lock our claims at our epochs first (``f``), find the runs
# ending with active children (``k``: left to the general path), then rebuild the document ``d`` with
# only the rows of workflows the fence locked and ``k`` does not name. Every write CTE reads ``d``.
_FENCED_ROWS = (("s", "x->>0"), ("c", "x->>2"), ("e", "x->>0"), ("r", "x #>> '{}'"))  # key, its workflow id
_FENCE_CTES = (
    "raw AS (SELECT %s::jsonb AS j), "
    f"f AS MATERIALIZED (SELECT c.workflow_id FROM {CLAIM_TABLE} c WHERE c.engine_id = %s AND "
    "(c.workflow_id, c.epoch) IN (SELECT x->>0, (x->>1)::bigint FROM raw, jsonb_array_elements(raw.j->'f') x) "
    "ORDER BY c.workflow_id FOR NO KEY UPDATE SKIP LOCKED), "
    f"k AS MATERIALIZED (SELECT DISTINCT parent_id AS workflow_id FROM {WORKFLOW_TABLE} WHERE parent_id = "
    "ANY(ARRAY(SELECT x->>0 FROM raw, jsonb_array_elements(raw.j->'e') x)) "
    f"AND status IN ({', '.join(['%s'] * len(ACTIVE_STATUSES))})), "
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


def _fits_one_statement(batch: list[WorkflowWrites], using: str) -> bool:
    """Whether this commit can be ONE autocommit statement that takes the fence itself (PostgreSQL,
    outside any transaction): a small batch (ONE_STATEMENT_MAX_WORKFLOWS) that writes only steps,
    consumed signals and terminal states of runs that are nobody's child. Updates, timers, stuck
    flags and children keep the general path."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block or not _step_columns_known():
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
        )
        for w in batch
    )


def _commit_in_one_statement(
    engine_id: str, batch: list[WorkflowWrites], now: datetime, using: str
) -> tuple[set[str], set[str]]:
    """The fenced commit as one autocommit statement: its first CTE locks the claims still held at
    these epochs (FOR NO KEY UPDATE, in workflow_id order, re-checked against the newest row version
    as any READ COMMITTED lock is) and every write reads its rows through that CTE, so nothing lands
    for a claim that is not ours; the locks last until the statement's own commit. One round trip
    instead of four (BEGIN, lock, write, COMMIT). Returns (claims held, held runs deferred to the
    general path: finishing runs with active children, whose closing needs more statements)."""
    rows = _run_write_statement(engine_id, batch, now, using, fence=True)
    held = {value for kind, value in rows if kind == "f"}
    return held, held & {value for kind, value in rows if kind == "k"}


def _run_write_statement(
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
        for s in _latest_per_seq(w.steps)
    ]
    # Every row of the statement travels in ONE jsonb parameter (json.dumps is C; quoting a few
    # hundred array elements one by one in the client-side binding is not), unpacked by position.
    document = {
        "s": steps,
        "c": consumed,
        "e": [[w.workflow_id, w.finish.status, w.finish.result, w.finish.error] for w in finished if w.finish],
        "r": released,
    }
    if fence:
        document["f"] = [[w.workflow_id, w.epoch] for w in batch]  # the claims the fence locks
    ids = "ARRAY(SELECT jsonb_array_elements_text(d.j->'{key}') FROM d)"
    ended_ids = "ARRAY(SELECT x->>0 FROM d, jsonb_array_elements(d.j->'e') AS x)"
    consumed_ids = "ARRAY(SELECT (x->>0)::bigint FROM d, jsonb_array_elements(d.j->'c') AS x)"
    active = ", ".join(["%s"] * len(ACTIVE_STATUSES))
    params: list[Any] = [json.dumps(document)]
    if fence:
        ctes = [_FENCE_CTES]
        params.extend([engine_id, *sorted(ACTIVE_STATUSES)])
    else:
        ctes = ["d AS (SELECT %s::jsonb AS j)"]
    if steps:
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _STEP_COLUMNS if c not in _STEP_KEPT)
        values = ", ".join(
            f"NULLIF(x->{i}, 'null')" if kind == "jsonb" else f"(x->>{i})::{kind}" for i, kind in enumerate(_STEP_TYPES)
        )
        ctes.append(
            f"steps AS (INSERT INTO {STEP_TABLE} ({', '.join(_STEP_COLUMNS)}) "
            f"SELECT {values} FROM d, jsonb_array_elements(d.j->'s') AS x "
            f"ON CONFLICT (run_id, seq) DO UPDATE SET {updates})"
        )
    if consumed:
        ctes.append(
            f"consumed AS (UPDATE {SIGNAL_TABLE} AS s SET state = %s, consumed_seq = (x->>1)::int "
            f"FROM d, jsonb_array_elements(d.j->'c') AS x WHERE s.id = (x->>0)::bigint)"
        )
        params.append(SignalState.CONSUMED)
    if finished:
        ctes.append(
            f"ended AS (UPDATE {WORKFLOW_TABLE} AS w SET status = x->>1, result = x->>2, "
            f"error = NULLIF(x->3, 'null'), finished_at = %s, updated_at = %s, current_step = '' "
            f"FROM d, jsonb_array_elements(d.j->'e') AS x WHERE w.id = x->>0)"
        )
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
        params.extend([UpdateStatus.FAILED, now, UpdateStatus.ACCEPTED, json.dumps(_TAKEN_ERROR), _MAILBOX_ERROR])
        params.extend([UpdateStatus.ADMITTED, UpdateStatus.ACCEPTED])
        ctes.append(f"timers AS (DELETE FROM {TIMER_TABLE} WHERE workflow_id = ANY({ended_ids}))")
    if released:
        # The fence locked these claims at our epochs in this transaction: clear the holder, keep the
        # epoch; a run that ends is no longer runnable (out of acquire's partial index).
        runnable = f"NOT (workflow_id = ANY({ended_ids}))" if finished else "TRUE"
        ctes.append(
            f"released AS (UPDATE {CLAIM_TABLE} SET engine_id = NULL, claimed_at = NULL, expires_at = NULL, "
            f"runnable = {runnable} WHERE engine_id = %s AND workflow_id = ANY({ids.format(key='r')}))"
        )
        params.append(engine_id)
    # The main query sends the r: wake-ups (delivered at commit) and finds the finished runs with
    # active children. It reads the snapshot from before this statement: a child ending in this
    # very commit still looks active, and close_children re-reads it (a false positive is harmless).
    parts = []
    if finished:
        parts.append(
            f"SELECT 'n', pg_notify(%s, 'r:' || id)::text FROM unnest({ended_ids}) AS id WHERE octet_length(id) < %s"
        )
        params.extend([CHANNEL, MAX_PAYLOAD - 2])
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
    connection = connections[using]
    with connection.cursor() as cursor:
        # Prepared (its planning costs more than its run) when it is its own transaction: the fence path.
        prepared.execute(cursor, connection, f"WITH {', '.join(ctes)} {main}", params)
        return [(kind, value) for kind, value in cursor.fetchall() if kind is not None]


def _close_mailboxes(workflow_ids: list[str], now: datetime, using: str) -> None:
    """The terminal commit: unconsumed signals are dropped, admitted updates fail, timers go."""
    BufferedSignal.objects.using(using).filter(workflow_id__in=workflow_ids, state=SignalState.BUFFERED).update(
        state=SignalState.DROPPED
    )
    PendingUpdate.objects.using(using).filter(workflow_id__in=workflow_ids, status=UpdateStatus.ACCEPTED).update(
        status=UpdateStatus.FAILED, completed_at=now, error=_TAKEN_ERROR
    )
    PendingUpdate.objects.using(using).filter(workflow_id__in=workflow_ids, status=UpdateStatus.ADMITTED).update(
        status=UpdateStatus.FAILED,
        completed_at=now,
        error={
            "type": "WorkflowTerminalError",
            "message": "The workflow ended before the update was applied.",
        },
    )
    Timer.objects.using(using).filter(workflow_id__in=workflow_ids).delete()


def release_locked_claims(engine_id: str, workflow_ids: list[str], using: str, *, ended: list[str]) -> None:
    """Clear the holder, keep the epoch, for claims this transaction has locked at our epochs (the
    fence already proved them ours): one statement per chunk. The ``ended`` runs' claims are no
    longer runnable (out of acquire's partial index)."""
    done = set(ended)
    with connections[using].cursor() as cursor:
        for runnable in (True, False):
            chosen = sorted(wid for wid in workflow_ids if (wid not in done) == runnable)
            for chunk in _chunks(chosen, 500):
                marks = ", ".join(["%s"] * len(chunk))
                cursor.execute(
                    f"UPDATE {CLAIM_TABLE} SET engine_id = NULL, claimed_at = NULL, expires_at = NULL, "
                    f"runnable = %s WHERE engine_id = %s AND workflow_id IN ({marks})",
                    [runnable, engine_id, *chunk],
                )


def release_claims(engine_id: str, epochs: dict[str, int], using: str) -> None:
    """Clear the holder, keep the epoch, only where the claim is still ours at that epoch."""
    with connections[using].cursor() as cursor:
        for wid, epoch in sorted(epochs.items()):
            cursor.execute(
                f"UPDATE {CLAIM_TABLE} SET engine_id = NULL, claimed_at = NULL, expires_at = NULL "
                f"WHERE workflow_id = %s AND epoch = %s AND engine_id = %s",
                [wid, epoch, engine_id],
            )


def write_steps(batch: list[WorkflowWrites], now: datetime, using: str) -> None:
    """Upsert every step of the batch in one statement (a step is inserted when dispatched or settled
    and updated when it settles; its epoch is the committing owner's)."""
    steps = [
        Step(
            workflow_id=w.workflow_id,
            run_id=w.run_id,
            seq=s.seq,
            kind=s.kind,
            name=s.name,
            status=s.status,
            result=s.result,
            error=s.error,
            attempts=s.attempts,
            epoch=w.epoch,
            started_at=s.started_at or now,
            completed_at=s.completed_at if s.completed_at or not s.settled else now,
        )
        for w in batch
        for s in _latest_per_seq(w.steps)
    ]
    if steps:
        Step.objects.using(using).bulk_create(
            steps,
            update_conflicts=True,
            unique_fields=["run_id", "seq"],
            update_fields=["kind", "name", "status", "result", "error", "attempts", "epoch", "completed_at"],
        )


def _with_active_children(workflow_ids: list[str], using: str) -> set[str]:
    """Which of these runs have active children (one query for the whole batch)."""
    parents = (
        Workflow.objects.using(using)
        .filter(parent_id__in=workflow_ids, status__in=list(ACTIVE_STATUSES))
        .values_list("parent_id", flat=True)
    )
    return {parent for parent in parents if parent is not None}


def _latest_per_seq(steps: list[StepRecord]) -> list[StepRecord]:
    """A step may be recorded twice before a commit (dispatched, then settled): keep its last state, since
    one upsert statement may not touch a row twice."""
    return list({step.seq: step for step in steps}.values())


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# -- messages -------------------------------------------------------------------------------------


@dataclasses.dataclass
class UpdateDone:
    """How the owner settled one admitted update: completed / rejected / failed (by its handler or
    validator), or accepted (a wait_for_update took its payload; respond() completes it later)."""

    update_id: str
    status: str
    result: str | None = None
    error: dict[str, Any] | None = None
    issues: list[dict[str, Any]] | None = None


class UpdateRaceLost(Exception):
    """An update the owner settled was no longer admitted at commit time: roll everything back."""


def apply_messages(batch: list[WorkflowWrites], now: datetime, using: str) -> None:
    """Write the message parts of these workflows' writes (inside their fenced transaction).

    An admitted update is settled only if it is still admitted: the caller's timeout writes
    ``expired`` with the mirror condition, so exactly one of the two lands. Losing raises
    UpdateRaceLost (the whole transaction rolls back: the handler's effects must not commit either).
    A respond() answer lands only while its update is still accepted (a repeat after a takeover is a no-op).
    """
    from ..models import AppliedUpdate

    answered: list[str] = []
    for w in batch:
        for done in w.updates_done:
            fields: dict[str, Any] = {"status": done.status, "result": done.result, "error": done.error}
            fields["issues"] = done.issues
            if done.status != UpdateStatus.ACCEPTED:
                fields["completed_at"] = now
                answered.append(done.update_id)
            won = (
                PendingUpdate.objects.using(using)
                .filter(pk=done.update_id, run_id=w.run_id, status=UpdateStatus.ADMITTED)
                .update(**fields)
            )
            if won != 1:
                raise UpdateRaceLost(f"update {done.update_id} of workflow {w.workflow_id!r} is no longer admitted")
        for update_id, text in w.update_responses:
            if (
                PendingUpdate.objects.using(using)
                .filter(pk=update_id, status=UpdateStatus.ACCEPTED)
                .update(status=UpdateStatus.COMPLETED, result=text, completed_at=now)
            ):
                answered.append(update_id)
    applied = [
        AppliedUpdate(
            workflow_id=w.workflow_id,
            run_id=w.run_id,
            seq=a.seq,
            n=a.n,
            name=a.name,
            payload=a.payload,
            result=a.result,
            error=a.error,
            update_id=a.update_id,
        )
        for w in batch
        for a in w.applied
    ]
    if applied:
        AppliedUpdate.objects.using(using).bulk_create(applied)
    if answered:
        send_many("a", answered, using)  # callers waiting in update() re-read their row


def fenced_messages(
    engine_id: str,
    epochs: dict[str, int],
    build: Callable[[set[str]], list[WorkflowWrites]],
    now: datetime,
    using: str,
) -> FenceResult:
    """A fenced commit whose writes are computed inside the transaction, after the fence is taken:
    ``build`` receives the workflows still held at their epochs and returns their writes (steps and
    message parts only). engine/messages.py locks the admitted updates and runs their handlers there,
    so a handler runs only where its outcome can commit, and a takeover waits for the commit."""
    with transaction.atomic(using=using):
        sessions.allow_user_code(using)  # build() runs update handlers
        held = lock_claims(engine_id, epochs, using, wait=False)
        batch = [w for w in build(held) if w.workflow_id in held and not w.empty] if held else []
        write_steps(batch, now, using)
        apply_messages(batch, now, using)
    lost, busy = classify_unheld(engine_id, {wid: e for wid, e in epochs.items() if wid not in held}, using)
    return FenceResult(held, lost, busy=busy)
