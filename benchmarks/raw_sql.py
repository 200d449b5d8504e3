"""The raw-SQL ceiling: plain psycopg 3 writing the rows weft_django writes per workflow, in batches.

    python -m benchmarks.raw_sql [--workflows 1000] [--batches 1,16,100] [--single-workflows 500]
        [--pattern regular|local] [--json FILE]

Database ``weft_peer_raw`` (dropped, re-created, migrated with weft_django's own migrations, so the
tables and every index are the real ones). One connection, one thread, no engine, no Python objects
beyond tuples: what PostgreSQL on this machine allows for this write pattern.

Per group of B workflows ("B workflows' steps per transaction"), 8 transactions, each one commit:

1. the starts: INSERT B ``weft_django_workflow`` rows + INSERT B ``weft_django_workflowclaim`` rows;
2. the acquire: UPDATE the B claims (engine_id, epoch + 1, claimed_at, expires_at) RETURNING epoch;
3. per step k = 1..3, two fenced transactions, as the engine commits a step before and after its
   activity runs: (i) lock the B claims (``SELECT ... FOR NO KEY UPDATE``, epoch checked) and INSERT
   B ``weft_django_step`` rows (running); (ii) lock the claims again and UPDATE the B step rows to
   completed; for k = 3 the same transaction also UPDATEs the B workflow rows (completed, result,
   finished_at) and releases the B claims (engine_id NULL).

Row writes per workflow: 2 inserts at start, 1 claim update (acquire), 3 step inserts, 3 step
updates, 1 workflow update, 1 claim update (release) = 11, i.e. 3.67 per step, exactly what the
weft_django throughput run writes (docs/benchmarks.md). Multi-row statements use ``unnest`` arrays.
Not done here: NOTIFY, reading back workflow state, activity execution.

``--pattern local`` is the write pattern of the same workflow with local activities
(``bench.three_local``: no attempt record before a step runs, the three steps and the end committed
together), 3 transactions per group: the starts and the acquire as above, then ONE fenced transaction
that INSERTs the B x 3 steps as completed, UPDATEs the B workflow rows and releases the B claims. Row
writes per workflow: 2 + 1 + 3 + 1 + 1 = 8, i.e. 2.67 per step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.peer_apps import common

ROOT = Path(__file__).resolve().parent.parent
# WEFT_RAW_PG_NAME: another database name, so that two sessions can measure at once.
DBNAME = os.environ.get("WEFT_RAW_PG_NAME") or common.DATABASES["raw"]
ENGINE = "raw-1"


def migrate() -> None:
    common.recreate_database(DBNAME)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.settings", "WEFT_BENCH_PG_NAME": DBNAME}
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)


FENCE = (
    "SELECT workflow_id, epoch FROM weft_django_workflowclaim WHERE engine_id = %s AND workflow_id = ANY(%s) "
    "ORDER BY workflow_id FOR NO KEY UPDATE"
)


def _fence(cur: Any, ids: list[str], epochs: dict[str, int]) -> None:
    cur.execute(FENCE, [ENGINE, ids])
    held = {wid for wid, epoch in cur.fetchall() if epochs[wid] == epoch}
    if len(held) != len(ids):
        raise RuntimeError("fence refused a workflow: impossible with one writer")


def _start_and_acquire(cur: Any, conn: Any, ids: list[str], run_ids: list[uuid.UUID]) -> dict[str, int]:
    with conn.transaction():  # 1. starts
        cur.execute(
            "INSERT INTO weft_django_workflow (id, run_id, workflow_type, version, status, input, "
            "parent_close_policy, depth, current_step, stuck_attempts, priority, created_at, updated_at) "
            "SELECT i, r, 'bench.three_noop', '1', 'running', %s, 'terminate', 0, '', 0, 0, now(), now() "
            "FROM unnest(%s::varchar[], %s::uuid[]) AS t(i, r)",
            ['{"args":[0],"kwargs":{}}', ids, run_ids],
        )
        cur.execute(
            "INSERT INTO weft_django_workflowclaim (workflow_id, epoch) SELECT i, 0 FROM unnest(%s::varchar[]) i",
            [ids],
        )
    with conn.transaction():  # 2. acquire
        cur.execute(
            "UPDATE weft_django_workflowclaim SET engine_id = %s, epoch = epoch + 1, claimed_at = now(), "
            "expires_at = now() + interval '30 seconds' WHERE workflow_id = ANY(%s) AND engine_id IS NULL "
            "RETURNING workflow_id, epoch",
            [ENGINE, ids],
        )
        return dict(cur.fetchall())


def _end(cur: Any, ids: list[str]) -> None:
    cur.execute(
        "UPDATE weft_django_workflow SET status = 'completed', result = '3', finished_at = now(), "
        "updated_at = now(), current_step = '' WHERE id = ANY(%s)",
        [ids],
    )
    cur.execute(
        "UPDATE weft_django_workflowclaim SET engine_id = NULL, claimed_at = NULL, expires_at = NULL "
        "WHERE engine_id = %s AND workflow_id = ANY(%s)",
        [ENGINE, ids],
    )


def run_group_local(conn: Any, ids: list[str], run_ids: list[uuid.UUID]) -> None:
    """``--pattern local``: starts, acquire, then the three completed steps and the end in ONE commit."""
    with conn.cursor() as cur:
        epochs = _start_and_acquire(cur, conn, ids, run_ids)
        with conn.transaction():  # 3. the three steps, completed, and the end
            _fence(cur, ids, epochs)
            cur.execute(
                "INSERT INTO weft_django_step (workflow_id, run_id, seq, kind, name, status, result, attempts, "
                "epoch, started_at, completed_at) SELECT i, r, k, 'activity', 'bench.noop_local', 'completed', "
                "k::text, 1, e, now(), now() FROM unnest(%s::varchar[], %s::uuid[], %s::bigint[]) AS t(i, r, e), "
                "generate_series(1, 3) AS k",
                [ids, run_ids, [epochs[i] for i in ids]],
            )
            _end(cur, ids)


def run_group(conn: Any, ids: list[str], run_ids: list[uuid.UUID]) -> None:
    """The regular pattern: starts, acquire, then per step a commit before and one after it runs."""
    with conn.cursor() as cur:
        epochs = _start_and_acquire(cur, conn, ids, run_ids)
        epoch_list = [epochs[i] for i in ids]
        for k in (1, 2, 3):
            with conn.transaction():  # 3(i). step started
                _fence(cur, ids, epochs)
                cur.execute(
                    "INSERT INTO weft_django_step (workflow_id, run_id, seq, kind, name, status, attempts, epoch, "
                    "started_at) SELECT i, r, %s, 'activity', 'bench.noop', 'running', 1, e, now() "
                    "FROM unnest(%s::varchar[], %s::uuid[], %s::bigint[]) AS t(i, r, e)",
                    [k, ids, run_ids, epoch_list],
                )
            with conn.transaction():  # 3(ii). step completed (+ the workflow's end for k = 3)
                _fence(cur, ids, epochs)
                cur.execute(
                    "UPDATE weft_django_step SET status = 'completed', result = %s, completed_at = now() "
                    "WHERE run_id = ANY(%s::uuid[]) AND seq = %s",
                    [str(k), run_ids, k],
                )
                if k == 3:
                    _end(cur, ids)


PATTERNS = {"regular": (run_group, 8), "local": (run_group_local, 3)}  # group writer, commits per group


def run_mode(batch: int, workflows: int, pattern: str = "regular") -> dict[str, Any]:
    import psycopg

    writer, commits = PATTERNS[pattern]
    with psycopg.connect(common.conninfo(DBNAME)) as conn:
        conn.execute("SELECT 1")
        conn.commit()
        groups = [
            [f"raw-{batch}-{g}-{j}" for j in range(min(batch, workflows - g))] for g in range(0, workflows, batch)
        ]
        before = common.db_counters(DBNAME)
        t0 = time.perf_counter()
        for ids in groups:
            writer(conn, ids, [uuid.uuid4() for _ in ids])
        seconds = time.perf_counter() - t0
    time.sleep(1.2)
    d = common.delta(before, common.db_counters(DBNAME))
    return {
        "batch": batch,
        "pattern": pattern,
        "workflows": workflows,
        "seconds": seconds,
        "workflows_per_s": workflows / seconds,
        "steps_per_s": 3 * workflows / seconds,
        "commits": len(groups) * commits,
        "commits_per_s": len(groups) * commits / seconds,
        "row_writes_per_step": (d["tup_inserted"] + d["tup_updated"] + d["tup_deleted"]) / (3 * workflows),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--single-workflows", type=int, default=500, help="workflows for batch size 1 (slow)")
    parser.add_argument("--batches", default="1,16,100")
    parser.add_argument("--pattern", choices=sorted(PATTERNS), default="regular", help="regular or local activities")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args(argv)
    migrate()
    modes = []
    for batch in [int(b) for b in args.batches.split(",")]:
        n = args.single_workflows if batch == 1 else args.workflows
        mode = run_mode(batch, n, args.pattern)
        modes.append(mode)
        print(
            f"raw SQL ({args.pattern}), {batch:>3} workflows' steps per transaction: "
            f"{mode['workflows_per_s']:8.1f} workflows/s "
            f"({mode['commits_per_s']:.0f} commits/s, {mode['row_writes_per_step']:.2f} row writes/step, "
            f"{n} workflows in {mode['seconds']:.2f} s)",
            flush=True,
        )
    if not args.keep:
        common.drop_database(DBNAME)
    result = {"system": "raw SQL (psycopg 3)", "database": DBNAME, "modes": modes}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
