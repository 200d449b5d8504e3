"""Test-only audit of every write the chaos run makes: PostgreSQL triggers record each INSERT, UPDATE
and DELETE on the workflow, step, claim, buffered-signal, pending-update and applied-update tables
into ``weft_audit.writes``; afterwards ``check_audit`` reads that log and reports every write that
should not have happened. Never part of the library's migrations: ``install`` puts the triggers into
the chaos database for one run and ``uninstall`` removes them (the suite's test database is shared
with the rest of the suite).

Who wrote: the engines of the chaos run connect with ``application_name = 'weft-<engine id>'``
(PGAPPNAME, set by the harness for every connection of the subprocess: loop, renewal, activity
threads); any other session is a client (the test process: start, signal, update, cancel).

Under which epoch: the trigger reads the workflow's claim row in the writing transaction (a fresh
snapshot: the newest committed version, or this transaction's own) and whether this transaction holds
that row (its xmin or xmax is one of this transaction's ids: the fence's ``FOR NO KEY UPDATE`` or this
transaction's own update of the claim). A fenced write is one made while the writer holds the claim
row locked and the claim names the writer; a step's ``epoch`` column must equal the claim's epoch.
When the same transaction also changed the claim (a release in the terminal commit), the checker
takes the claim as it was before that change (the OLD values of the transaction's first claim write).

What is checked (each a list of violations, empty when the run kept its promise):

- ``A1 fenced writes``: every engine write of workflow-scoped state (steps, applied updates, the end
  of a run, a signal consumed or dropped, an update settled) was made by the claim's holder, under
  the claim's current epoch, with the claim row locked by the writing transaction; the engine's own
  claim writes have a legitimate shape (acquire a free claim, take over an expired one, renew or
  release its own); writes only an engine may make did not come from a client. The legitimate
  non-fenced writers are told apart: a client's start, signal, update, its caller-side expiry and its
  transitions (cancel); an engine's child-terminal record into a parent's mailbox, its children and
  schedule fires, and its message cleanup (expiring abandoned updates, failing those of ended runs).
- ``A2 no duplicate steps``: no (run, seq) inserted twice; no settled step's outcome rewritten.
- ``A3 no run ended twice``: a run goes from active to terminal at most once, and nothing changes
  after that.
- ``A4 no double consumption or settlement``: a signal is consumed at most once, and never after it
  was dropped; an update is settled (completed, rejected, failed, expired) at most once.
- ``A5 durable in the order made``: in a sequential workflow, a step becomes durable only with or
  after the step before it settled; an applied update or an update's settlement only with or after
  every step before the one it was applied at; a signal is consumed in the same commit as its step.
- ``A6 acknowledged messages in the final history``: every update whose ``update()`` returned has its
  record in the run that finished (an applied-update row, or the wait_for_update step that took it),
  and every acknowledged signal was consumed by a settled signal step of that run, or dropped because
  the run ended.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections

from weft_django.codec import decode

SCHEMA = "weft_audit"
ENGINE_PREFIX = "weft-"

# (table, the column naming the workflow, the column naming the row)
AUDITED = (
    ("weft_django_workflow", "id", "id"),
    ("weft_django_step", "workflow_id", "id"),
    ("weft_django_workflowclaim", "workflow_id", "workflow_id"),
    ("weft_django_bufferedsignal", "workflow_id", "id"),
    ("weft_django_pendingupdate", "workflow_id", "id"),
    ("weft_django_appliedupdate", "workflow_id", "id"),
)
SHORT = {
    "weft_django_workflow": "workflow",
    "weft_django_step": "step",
    "weft_django_workflowclaim": "claim",
    "weft_django_bufferedsignal": "signal",
    "weft_django_pendingupdate": "update",
    "weft_django_appliedupdate": "applied",
}

ACTIVE = {"pending", "running", "suspended"}
TERMINAL = {"completed", "failed", "cancelled", "terminated", "timed_out", "continued"}
STEP_SETTLED = {"completed", "failed"}
UPDATE_SETTLED = {"completed", "rejected", "failed", "expired"}

INSTALL_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.writes (
    id bigserial PRIMARY KEY,
    tbl text NOT NULL,
    op text NOT NULL,
    row_key text NOT NULL,
    workflow_id text,
    old jsonb,
    new jsonb,
    writer text NOT NULL,
    backend_pid int NOT NULL,
    txid bigint NOT NULL,
    at timestamptz NOT NULL,
    claim_epoch bigint,
    claim_engine text,
    claim_mine boolean,
    parent_claim_epoch bigint,
    parent_claim_engine text,
    parent_claim_mine boolean,
    wf_status text,
    wf_run_id text
);

-- Does this transaction hold the row version (xmin: it wrote it; xmax: it locked or replaced it)?
-- The top-level id first; a subtransaction's id or a multixact through pg_locks (our own xid locks).
CREATE OR REPLACE FUNCTION {SCHEMA}.mine(row_xmin xid, row_xmax xid) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    me bigint := pg_current_xact_id()::text::bigint % 4294967296;
BEGIN
    IF row_xmin IS NULL THEN
        RETURN false;
    END IF;
    IF row_xmin::text::bigint = me OR row_xmax::text::bigint = me THEN
        RETURN true;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'transactionid' AND l.pid = pg_backend_pid()
               AND l.transactionid IN (row_xmin, row_xmax)) THEN
        RETURN true;
    END IF;
    IF row_xmax::text <> '0' THEN
        BEGIN  -- xmax may be a multixact (several lockers): are we among its members?
            RETURN EXISTS (SELECT 1 FROM pg_get_multixact_members(row_xmax) m
                           JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = m.xid
                           WHERE l.pid = pg_backend_pid());
        EXCEPTION WHEN OTHERS THEN
            RETURN false;
        END;
    END IF;
    RETURN false;
END $$;

CREATE OR REPLACE FUNCTION {SCHEMA}.record() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    o jsonb;
    n jsonb;
    r jsonb;
    wid text;
    rkey text;
    c_epoch bigint;
    c_engine text;
    c_xmin xid;
    c_xmax xid;
    c_mine boolean;
    p_epoch bigint;
    p_engine text;
    p_xmin xid;
    p_xmax xid;
    p_mine boolean;
    w_status text;
    w_run text;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        o := to_jsonb(OLD) - 'input' - 'payload' - 'error' - 'stuck_error' - 'issues';
    END IF;
    IF TG_OP <> 'DELETE' THEN
        n := to_jsonb(NEW) - 'input' - 'payload' - 'error' - 'stuck_error' - 'issues';
    END IF;
    IF TG_OP = 'UPDATE' AND o = n THEN
        RETURN NULL;  -- nothing that matters changed (an error text only)
    END IF;
    r := coalesce(n, o);
    wid := r ->> TG_ARGV[0];
    rkey := CASE WHEN TG_TABLE_NAME = 'weft_django_step' THEN (r ->> 'run_id') || ':' || (r ->> 'seq')
                 ELSE r ->> TG_ARGV[1] END;
    IF TG_TABLE_NAME <> 'weft_django_workflowclaim' THEN
        SELECT epoch, engine_id, xmin, xmax INTO c_epoch, c_engine, c_xmin, c_xmax
        FROM weft_django_workflowclaim WHERE workflow_id = wid;
        c_mine := {SCHEMA}.mine(c_xmin, c_xmax);
    END IF;
    IF TG_TABLE_NAME = 'weft_django_workflow' THEN
        IF r ->> 'parent_id' IS NOT NULL THEN
            SELECT epoch, engine_id, xmin, xmax INTO p_epoch, p_engine, p_xmin, p_xmax
            FROM weft_django_workflowclaim WHERE workflow_id = r ->> 'parent_id';
            p_mine := {SCHEMA}.mine(p_xmin, p_xmax);
        END IF;
    ELSE
        SELECT status, run_id::text INTO w_status, w_run FROM weft_django_workflow WHERE id = wid;
    END IF;
    INSERT INTO {SCHEMA}.writes (tbl, op, row_key, workflow_id, old, new, writer, backend_pid, txid, at,
        claim_epoch, claim_engine, claim_mine, parent_claim_epoch, parent_claim_engine, parent_claim_mine,
        wf_status, wf_run_id)
    VALUES (TG_TABLE_NAME, TG_OP, rkey, wid, o, n, current_setting('application_name'), pg_backend_pid(),
        pg_current_xact_id()::text::bigint, clock_timestamp(),
        c_epoch, c_engine, c_mine, p_epoch, p_engine, p_mine, w_status, w_run);
    RETURN NULL;
END $$;
"""


def install(using: str = "default") -> None:
    """Create the audit table and the triggers (idempotent); empties the log of an earlier run."""
    with connections[using].cursor() as cursor:
        cursor.execute(INSTALL_SQL)
        cursor.execute(f"TRUNCATE {SCHEMA}.writes RESTART IDENTITY")
        for table, wid_column, key_column in AUDITED:
            cursor.execute(f"DROP TRIGGER IF EXISTS weft_audit ON {table}")
            cursor.execute(
                f"CREATE TRIGGER weft_audit AFTER INSERT OR UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.record('{wid_column}', '{key_column}')"
            )


def uninstall(using: str = "default") -> None:
    """Remove the triggers and the log (the database is left as the migrations made it)."""
    with connections[using].cursor() as cursor:
        for table, _, _ in AUDITED:
            cursor.execute(f"DROP TRIGGER IF EXISTS weft_audit ON {table}")
        cursor.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


@dataclass
class Write:
    id: int
    tbl: str
    op: str
    key: str
    workflow_id: str | None
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    writer: str
    pid: int
    txid: int
    at: datetime
    claim_epoch: int | None
    claim_engine: str | None
    claim_mine: bool | None
    parent_claim_epoch: int | None
    parent_claim_engine: str | None
    parent_claim_mine: bool | None
    wf_status: str | None
    wf_run_id: str | None

    @property
    def engine(self) -> str | None:
        """The writing engine's id, or None for a client."""
        return self.writer[len(ENGINE_PREFIX) :] if self.writer.startswith(ENGINE_PREFIX) else None

    @property
    def row(self) -> dict[str, Any]:
        return self.new if self.new is not None else (self.old or {})

    def was(self, column: str) -> Any:
        return (self.old or {}).get(column)

    def now(self, column: str) -> Any:
        return (self.new or {}).get(column)

    def changed(self, column: str) -> bool:
        return self.was(column) != self.now(column)

    def describe(self) -> str:
        columns = ("status", "state", "epoch", "engine_id", "seq", "kind", "consumed_seq", "run_id")
        old = {k: self.was(k) for k in columns if self.old and k in self.old}
        new = {k: self.now(k) for k in columns if self.new and k in self.new}
        return (
            f"#{self.id} {SHORT.get(self.tbl, self.tbl)} {self.op} {self.key} (workflow {self.workflow_id}) "
            f"by {self.writer or 'client'} "
            f"tx {self.txid} at {self.at.isoformat()} old={old} new={new} "
            f"claim=(epoch {self.claim_epoch}, {self.claim_engine}, locked by writer: {self.claim_mine})"
        )


def load(using: str = "default") -> list[Write]:
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"""SELECT id, tbl, op, row_key, workflow_id, old, new, writer, backend_pid, txid, at, claim_epoch,
                       claim_engine, claim_mine, parent_claim_epoch, parent_claim_engine, parent_claim_mine,
                       wf_status, wf_run_id
                FROM {SCHEMA}.writes ORDER BY id"""
        )
        rows = cursor.fetchall()
    out = []
    for row in rows:
        values = list(row)
        for i in (5, 6):  # jsonb columns: psycopg decodes them; a str if a loader did not
            if isinstance(values[i], str):
                values[i] = json.loads(values[i])
        out.append(Write(*values))
    return out


def _ts(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value))


@dataclass
class Audit:
    """The log, indexed for the checks."""

    writes: list[Write]
    claim_writes: dict[tuple[int, str], list[Write]] = field(default_factory=dict)  # (txid, workflow) -> claim writes

    def __post_init__(self) -> None:
        index: dict[tuple[int, str], list[Write]] = defaultdict(list)
        for w in self.writes:
            if w.tbl == "weft_django_workflowclaim" and w.workflow_id is not None:
                index[(w.txid, w.workflow_id)].append(w)
        self.claim_writes = dict(index)

    def claim_state(self, w: Write) -> tuple[int | None, str | None]:
        """(epoch, holder) of w's workflow's claim as the writing transaction held it."""
        own = self.claim_writes.get((w.txid, w.workflow_id or ""))
        if w.claim_mine and own:
            first = own[0]
            acquired = first.old is None or (
                first.now("engine_id") is not None and first.now("epoch") != first.was("epoch")
            )
            state = first.new if acquired else first.old
            assert state is not None
            return state.get("epoch"), state.get("engine_id")
        return w.claim_epoch, w.claim_engine

    def fenced(self, w: Write, *, epoch_column: bool) -> str | None:
        """None if w was written by the claim's holder at its current epoch under the claim's lock; else why not."""
        epoch, holder = self.claim_state(w)
        if not w.claim_mine:
            return "the writing transaction did not hold the claim row"
        if holder != w.engine:
            return f"the claim's holder was {holder!r} (epoch {epoch})"
        if epoch_column and w.row.get("epoch") != epoch:
            return f"written at epoch {w.row.get('epoch')} while the claim's epoch was {epoch}"
        return None


def _fence_violations(audit: Audit) -> tuple[list[str], Counter[str]]:
    out: list[str] = []
    kinds: Counter[str] = Counter()

    def bad(w: Write, why: str) -> None:
        out.append(f"{w.describe()}: {why}")

    epochs_given: dict[int, Write] = {}
    for w in audit.writes:
        table, engine = SHORT[w.tbl], w.engine
        who = "engine" if engine else "client"
        if table == "claim":
            new_epoch = w.now("epoch")
            if new_epoch and (w.op == "INSERT" or w.changed("epoch")):
                first = epochs_given.setdefault(new_epoch, w)
                if first is not w:
                    bad(w, f"epoch {new_epoch} given again (first by #{first.id} to {first.workflow_id})")
            if w.op != "UPDATE":
                kinds[f"{who} claim {w.op.lower()}"] += 1
                continue
            old_holder, new_holder = w.was("engine_id"), w.now("engine_id")
            if engine is None:
                kinds["client claim transition"] += 1
                if new_holder is not None and new_holder != old_holder:
                    bad(w, "a client gave the claim to an engine")
                continue
            if w.changed("epoch"):
                if (new_epoch or 0) <= (w.was("epoch") or 0):
                    bad(w, "the epoch did not go up")
                if new_holder != engine:
                    bad(w, "an engine moved the epoch without taking the claim")
                elif old_holder is None:
                    kinds["engine claim acquire"] += 1
                else:
                    kinds["engine claim takeover"] += 1
                    expires = _ts(w.was("expires_at"))
                    if old_holder != engine and (expires is None or expires >= w.at):
                        bad(w, f"took over a live claim (it expired at {expires})")
            elif old_holder != engine:
                bad(w, f"changed a claim held by {old_holder!r}")
            elif new_holder is None:
                kinds["engine claim release"] += 1
            elif new_holder == engine:
                kinds["engine claim renew" if w.changed("expires_at") else "engine claim other"] += 1
            else:
                bad(w, "handed the claim to another engine")
            continue
        if engine is None:
            _client_write(w, bad, kinds)
            continue
        if table in ("step", "applied"):
            kinds[f"engine {table} {w.op.lower()}"] += 1
            if w.op == "DELETE" and w.wf_status in TERMINAL:
                continue  # retention of a finished run
            why = audit.fenced(w, epoch_column=table == "step")
            if why:
                bad(w, why)
        elif table == "workflow":
            if w.op == "INSERT":
                if w.row.get("parent_id") is not None:
                    kinds["engine child start"] += 1
                    if not (w.parent_claim_mine and w.parent_claim_engine == engine):
                        bad(w, f"a child started without its parent's claim ({w.parent_claim_engine!r})")
                elif w.row.get("schedule_id") is not None:
                    kinds["engine schedule fire"] += 1
                else:
                    bad(w, "an engine started a workflow that is nobody's child and no schedule's fire")
            elif w.op == "DELETE":
                kinds["engine workflow delete"] += 1
                if w.was("status") not in TERMINAL:
                    bad(w, "an engine deleted an active workflow")
            elif w.was("status") == "pending" and w.now("status") == "running":
                kinds["engine delayed start"] += 1
                if not w.claim_mine:
                    bad(w, "a delayed start without the claim row locked")
            else:
                kinds["engine workflow update"] += 1
                why = audit.fenced(w, epoch_column=False)
                closing_child = (
                    w.now("status") in TERMINAL
                    and w.parent_claim_mine
                    and w.parent_claim_engine == engine
                    and w.now("status") != "completed"
                )
                if why and not closing_child:
                    bad(w, why)
        elif table == "signal":
            if w.op == "INSERT":
                kinds["engine child-terminal record"] += 1  # into the parent's mailbox, under the child's fence
            elif w.op == "DELETE":
                kinds["engine signal delete"] += 1
                if w.wf_status in ACTIVE:
                    bad(w, "an engine deleted a signal of an active run")
            else:
                kinds["engine signal update"] += 1
                why = audit.fenced(w, epoch_column=False)
                if why:
                    bad(w, why)
        elif table == "update":
            if w.op == "INSERT":
                bad(w, "an engine admitted an update")
            elif w.op == "DELETE":
                kinds["engine update retention"] += 1
                if w.was("status") not in UPDATE_SETTLED:
                    bad(w, "an engine deleted an unsettled update")
            elif audit.fenced(w, epoch_column=False) is None:
                kinds["engine update settle"] += 1
            elif w.was("status") == "admitted" and w.now("status") == "expired":
                kinds["engine update cleanup (abandoned)"] += 1
            elif (
                w.was("status") in ("admitted", "accepted")
                and w.now("status") == "failed"
                and (w.wf_status not in ACTIVE or w.wf_run_id != w.row.get("run_id"))
            ):
                kinds["engine update cleanup (run ended)"] += 1
            else:
                bad(w, audit.fenced(w, epoch_column=False) or "")
    return out, kinds


def _client_write(w: Write, bad: Any, kinds: Counter[str]) -> None:
    """A client (not an engine): start, signal, update and transitions are legitimate; the rest only an
    engine may write."""
    table = SHORT[w.tbl]
    if w.op == "DELETE":
        kinds[f"client {table} delete"] += 1
        return
    if table in ("step", "applied"):
        bad(w, f"a client wrote a {table}")
    elif table == "workflow":
        if w.op == "INSERT":
            kinds["client start"] += 1
        elif w.now("status") in ("completed", "failed") and w.changed("status"):
            bad(w, "a client ended a run as completed/failed (only its engine may)")
        else:
            kinds["client workflow transition"] += 1
    elif table == "signal":
        if w.op == "INSERT":
            kinds["client signal"] += 1
        elif w.was("state") == "buffered" and w.now("state") == "dropped":
            kinds["client transition drops a signal"] += 1
        else:
            bad(w, "a client changed a signal's state")
    elif table == "update":
        if w.op == "INSERT":
            kinds["client update admitted"] += 1
        elif w.was("status") == "admitted" and w.now("status") == "expired":
            kinds["client update expired (caller's timeout)"] += 1
        elif w.was("status") == "expired" and w.now("status") == "admitted":
            kinds["client update re-admitted (retry)"] += 1
        elif w.was("status") in ("admitted", "accepted") and w.now("status") == "failed":
            kinds["client transition fails an update"] += 1
        else:
            bad(w, "a client settled an update (only its engine may)")


def duplicate_steps(audit: Audit) -> list[str]:
    out = []
    inserted: dict[str, Write] = {}
    for w in audit.writes:
        if w.tbl != "weft_django_step":
            continue
        if w.op == "INSERT":
            first = inserted.setdefault(w.key, w)
            if first is not w:
                out.append(f"{w.describe()}: step inserted again (first #{first.id})")
        elif (
            w.op == "UPDATE"
            and w.was("status") in STEP_SETTLED
            and any(w.changed(column) for column in ("status", "result", "kind", "name"))
        ):
            out.append(f"{w.describe()}: a settled step's outcome rewritten")
    return out


def runs_ended_twice(audit: Audit) -> list[str]:
    out = []
    ended: dict[tuple[str, Any], Write] = {}
    for w in audit.writes:
        if w.tbl != "weft_django_workflow" or w.op != "UPDATE":
            continue
        run = (w.key, w.now("run_id"))
        if w.was("status") in TERMINAL and w.was("run_id") == w.now("run_id"):
            if w.changed("status") or w.changed("result"):
                out.append(f"{w.describe()}: changed after its run ended (ended by #{ended.get(run, w).id})")
        elif w.now("status") in TERMINAL:
            first = ended.setdefault(run, w)
            if first is not w:
                out.append(f"{w.describe()}: the run ended again (first by #{first.id})")
    return out


def double_consumption(audit: Audit) -> list[str]:
    out = []
    consumed: dict[str, Write] = {}
    settled: dict[str, Write] = {}
    for w in audit.writes:
        if w.op != "UPDATE":
            continue
        if w.tbl == "weft_django_bufferedsignal":
            if w.was("state") in ("consumed", "dropped") and (w.changed("state") or w.changed("consumed_seq")):
                out.append(f"{w.describe()}: a {w.was('state')} signal changed again")
            elif w.now("state") == "consumed":
                first = consumed.setdefault(w.key, w)
                if first is not w:
                    out.append(f"{w.describe()}: consumed again (first by #{first.id})")
        elif w.tbl == "weft_django_pendingupdate":
            if w.was("status") in UPDATE_SETTLED and w.was("status") != "expired" and w.changed("status"):
                out.append(f"{w.describe()}: a settled update settled again")
            elif w.was("status") in UPDATE_SETTLED and w.changed("result"):
                out.append(f"{w.describe()}: a settled update's result rewritten")
            elif w.now("status") in UPDATE_SETTLED and w.now("status") != "expired":
                first = settled.setdefault(w.key, w)
                if first is not w:
                    out.append(f"{w.describe()}: settled again (first by #{first.id})")
    return out


def durable_in_order(audit: Audit, sequential_runs: set[str]) -> list[str]:
    """A step of a sequential workflow is made only after the previous step's outcome is known, so it
    must not become durable before that outcome does: for seq k, the commit that first writes step k is
    the commit that settles step k - 1 or a later one. Likewise an applied update (at seq s) and an
    update's settlement come with or after every step before s; a consumption comes with its step."""
    out = []
    first_write: dict[tuple[str, int], Write] = {}
    settled_at: dict[tuple[str, int], Write] = {}
    applied: list[Write] = []
    consumptions: list[Write] = []
    answers: list[Write] = []
    for w in audit.writes:
        row = w.row
        if w.tbl == "weft_django_step" and w.op != "DELETE":
            key = (str(row.get("run_id")), int(row["seq"]))
            first_write.setdefault(key, w)
            if row.get("status") in STEP_SETTLED and w.was("status") not in STEP_SETTLED:
                settled_at.setdefault(key, w)
        elif w.tbl == "weft_django_appliedupdate" and w.op == "INSERT":
            applied.append(w)
        elif w.tbl == "weft_django_bufferedsignal" and w.op == "UPDATE" and w.now("state") == "consumed":
            if w.was("state") != "consumed":
                consumptions.append(w)
        elif (
            w.tbl == "weft_django_pendingupdate"
            and w.op == "UPDATE"
            and w.changed("status")
            and w.now("status") in ("completed", "accepted")
        ):
            answers.append(w)

    def before_durable(run: str, seq: int, w: Write) -> str | None:
        """None if every step < seq of run had settled in w's commit or an earlier one."""
        for earlier in range(seq):
            done = settled_at.get((run, earlier))
            if done is None:
                return f"seq {earlier} never settled"
            if done.txid != w.txid and done.id > w.id:
                return f"seq {earlier} settled later, by {done.describe()}"
        return None

    for (run, seq), w in first_write.items():
        if run not in sequential_runs or seq == 0:
            continue
        previous = settled_at.get((run, seq - 1))
        if previous is None:
            out.append(f"{w.describe()}: durable while seq {seq - 1} never settled")
        elif previous.txid != w.txid and previous.id > w.id:
            out.append(f"{w.describe()}: durable before seq {seq - 1} settled (by {previous.describe()})")
    for w in applied:
        run = str(w.row.get("run_id"))
        if run in sequential_runs:
            why = before_durable(run, int(w.row["seq"]), w)
            if why:
                out.append(f"{w.describe()}: update applied at seq {w.row.get('seq')} while {why}")
    # An update's answer: its wait_for_update step (accepted) or its applied row must be durable with it.
    taken: dict[str, tuple[str, int, Write]] = {}
    for (run, seq), w in settled_at.items():
        if w.row.get("kind") == "update" and run in sequential_runs:
            try:
                record = decode(w.row.get("result") or "null")
            except Exception:  # a corrupt record is another check's business
                continue
            if isinstance(record, dict) and record.get("update_id"):
                taken[str(record["update_id"])] = (run, seq, w)
    for w in answers:
        if w.key in taken:
            run, seq, step = taken[w.key]
            if w.now("status") == "accepted" and step.txid != w.txid:
                out.append(f"{w.describe()}: accepted apart from its step {step.describe()}")
            why = before_durable(run, seq, w)
            if why:
                out.append(f"{w.describe()}: answered (taken at seq {seq}) while {why}")
    steps_by_tx = {(str(w.row.get("run_id")), int(w.row["seq"]), w.txid) for w in settled_at.values()}
    for w in consumptions:
        run, seq = str(w.row.get("run_id")), w.now("consumed_seq")
        if run in sequential_runs and (run, seq, w.txid) not in steps_by_tx:
            out.append(f"{w.describe()}: consumed apart from the commit that settled its step seq {seq}")
    return out


@dataclass(frozen=True)
class AckedMessage:
    """A message the client was told is durable: ``kind`` "signal" (signal() returned) or "update"
    (update() returned a result); ``via`` for updates: "handler" (on_update) or "wait" (wait_for_update)."""

    workflow_id: str
    kind: str
    key: str  # signal_id, or the update's idempotency key
    via: str = "handler"


def acknowledged_in_history(acked: Iterable[AckedMessage], using: str = "default") -> list[str]:
    out = []
    acked = list(acked)
    ids = sorted({a.workflow_id for a in acked})
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT id, status, run_id::text FROM weft_django_workflow WHERE id = ANY(%s)",
            [ids],
        )
        runs = {wid: (status, run) for wid, status, run in cursor.fetchall()}
        cursor.execute(
            "SELECT run_id::text, seq, kind, status, result FROM weft_django_step WHERE workflow_id = ANY(%s)",
            [ids],
        )
        steps = {(run, seq): (kind, status, result) for run, seq, kind, status, result in cursor.fetchall()}
        cursor.execute(
            "SELECT workflow_id, signal_id, run_id::text, state, consumed_seq FROM weft_django_bufferedsignal"
            " WHERE workflow_id = ANY(%s)",
            [ids],
        )
        signals: dict[tuple[str, str], list[tuple[str, str, int | None]]] = defaultdict(list)
        for wid, signal_id, run, state, seq in cursor.fetchall():
            signals[(wid, signal_id)].append((run, state, seq))
        cursor.execute(
            "SELECT u.workflow_id, u.idempotency_key, u.id::text, u.run_id::text, u.status,"
            " (SELECT count(*) FROM weft_django_appliedupdate a WHERE a.update_id = u.id AND a.run_id = u.run_id)"
            " FROM weft_django_pendingupdate u WHERE u.workflow_id = ANY(%s)",
            [ids],
        )
        updates: dict[tuple[str, str], list[tuple[str, str, str, int]]] = defaultdict(list)
        for wid, key, pk, run, status, n_applied in cursor.fetchall():
            updates[(wid, key)].append((pk, run, status, n_applied))
    taken: dict[str, tuple[str, int]] = {}
    for (run, seq), (kind, status, result) in steps.items():
        if kind == "update" and status == "completed" and result:
            try:
                record = decode(result)
            except Exception:  # as above
                continue
            if isinstance(record, dict) and record.get("update_id"):
                taken[str(record["update_id"])] = (run, seq)
    for ack in acked:
        status, final_run = runs.get(ack.workflow_id, (None, None))
        where = f"{ack.workflow_id}: {ack.kind} {ack.key!r}"
        if status is None:
            out.append(f"{where}: its workflow is gone")
            continue
        if ack.kind == "signal":
            found = signals.get((ack.workflow_id, ack.key), [])
            if len(found) != 1:
                out.append(f"{where}: stored {len(found)} times")
                continue
            run, state, seq = found[0]
            if state == "consumed":
                step = steps.get((run, seq)) if seq is not None else None
                if run != final_run or step is None or step[0] != "signal" or step[1] not in STEP_SETTLED:
                    out.append(f"{where}: consumed at seq {seq} of run {run}, not a settled signal step of {final_run}")
            elif state == "dropped":
                if status in ACTIVE:
                    out.append(f"{where}: dropped but the run is still {status}")
            elif status not in ACTIVE:
                out.append(f"{where}: still {state} on a {status} run (neither consumed nor dropped)")
        else:
            found_updates = [u for u in updates.get((ack.workflow_id, ack.key), []) if u[2] == "completed"]
            if len(found_updates) != 1:
                out.append(f"{where}: {len(found_updates)} completed rows")
                continue
            pk, run, _, n_applied = found_updates[0]
            if run != final_run:
                out.append(f"{where}: completed in run {run}, the run that finished is {final_run}")
            elif ack.via == "handler" and n_applied != 1:
                out.append(f"{where}: {n_applied} applied-update rows in the final run")
            elif ack.via == "wait":
                at = taken.get(pk)
                if at is None or at[0] != final_run:
                    out.append(f"{where}: no completed wait_for_update step of the final run took it")
    return out


def check_audit(
    acked: Iterable[AckedMessage], sequential_types: set[str], using: str = "default"
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Run every audit check: ({name: violations}, figures about the log)."""
    audit = Audit(load(using))
    fence, kinds = _fence_violations(audit)
    sequential_runs = {
        str(w.row.get("run_id"))
        for w in audit.writes
        if w.tbl == "weft_django_workflow" and w.row.get("workflow_type") in sequential_types
    }
    violations = {
        "A1 fenced writes (no stale epoch, no non-holder)": fence,
        "A2 no duplicate steps": duplicate_steps(audit),
        "A3 no run ended twice": runs_ended_twice(audit),
        "A4 no double consumption or settlement": double_consumption(audit),
        "A5 durable in the order made": durable_in_order(audit, sequential_runs),
        "A6 acknowledged messages in the final history": acknowledged_in_history(acked, using),
    }
    by_table = Counter(SHORT[w.tbl] for w in audit.writes)
    figures = {
        "audited_writes": len(audit.writes),
        "by_table": dict(sorted(by_table.items())),
        "engine_writes": sum(1 for w in audit.writes if w.engine),
        "client_writes": sum(1 for w in audit.writes if not w.engine),
        "transactions": len({w.txid for w in audit.writes}),
        "by_kind": dict(sorted(kinds.items())),
    }
    return violations, figures
