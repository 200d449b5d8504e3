"""The recording half of the write audit (overview: tests/chaos/audit.py): the trigger SQL that logs every
INSERT, UPDATE and DELETE on the audited tables into ``weft_audit.writes``, and ``install`` / ``uninstall``
that put it into the chaos database for one run and take it out again.
"""

from __future__ import annotations

from django.db import connections

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
    wf_run_id text,
    holder_heartbeat timestamptz
);
ALTER TABLE {SCHEMA}.writes ADD COLUMN IF NOT EXISTS holder_heartbeat timestamptz;

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
    h_beat timestamptz;
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
    IF TG_TABLE_NAME = 'weft_django_workflowclaim' AND o ->> 'engine_id' IS NOT NULL THEN
        -- the previous holder's last heartbeat: a takeover may follow its lapse (ADR 0014)
        SELECT heartbeat_at INTO h_beat FROM weft_django_engine WHERE id = o ->> 'engine_id';
    END IF;
    INSERT INTO {SCHEMA}.writes (tbl, op, row_key, workflow_id, old, new, writer, backend_pid, txid, at,
        claim_epoch, claim_engine, claim_mine, parent_claim_epoch, parent_claim_engine, parent_claim_mine,
        wf_status, wf_run_id, holder_heartbeat)
    VALUES (TG_TABLE_NAME, TG_OP, rkey, wid, o, n, current_setting('application_name'), pg_backend_pid(),
        pg_current_xact_id()::text::bigint, clock_timestamp(),
        c_epoch, c_engine, c_mine, p_epoch, p_engine, p_mine, w_status, w_run, h_beat);
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
