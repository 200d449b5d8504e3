"""Run the weft_django benchmarks and print a results table.

    python -m benchmarks.run [--workflows 1000] [--scenarios throughput[,backlog]] [--engine-concurrency 8]
                             [--conn-max-age SECONDS|none] [--analyze] [--trace-sql] [--py-spy]
                             [--engine-verbosity 1]

Each run drops and re-creates the PostgreSQL database ``weft_bench`` (see benchmarks/settings.py),
migrates it, and runs the scenarios against ONE real ``weft_engine`` subprocess:

* ``throughput`` (the default): the engine is up, then one client starts N ``bench.three_noop``
  workflows, one ``weft.start()`` call each, as fast as it can; timed from the first start to the
  last completion.
* ``backlog``: the N workflows are started while no engine runs, then the engine drains them; timed
  from its first step to the last completion (the engine's own capacity, without a competing client).

The table is printed and written as JSON to ``benchmarks/results/<timestamp>.json`` (gitignored), next
to the engine's log (and, with the flags, its SQL trace and py-spy stacks). See docs/benchmarks.md.
Not collected by pytest (testpaths = tests).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
POLL_SECONDS = 0.05
STALL_SECONDS = 60.0


# ------------------------------------------------------------------------------------------ database


def _conninfo(dbname: str) -> dict[str, Any]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    return {"dbname": dbname, "user": db["USER"], "host": db["HOST"], "port": db["PORT"]}


def recreate_database() -> None:
    import psycopg
    from django.conf import settings

    name = settings.DATABASES["default"]["NAME"]
    with psycopg.connect(**_conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def stats_connection() -> Any:
    import psycopg
    from django.conf import settings

    return psycopg.connect(**_conninfo(settings.DATABASES["default"]["NAME"]), autocommit=True)


def server_facts() -> dict[str, Any]:
    with stats_connection() as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        preload = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('synchronous_commit', 'fsync', 'shared_buffers', 'max_connections', 'wal_level')"
            ).fetchall()
        )
        pgss = False
        if "pg_stat_statements" in preload:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            pgss = True
    return {"server_version": version, "pg_stat_statements": pgss, "settings": settings}


def db_counters() -> dict[str, Any]:
    """Database-wide counters of weft_bench (pg_stat_database) and row writes per table."""
    with stats_connection() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        xact_commit, xact_rollback, tup_ins, tup_upd, tup_del, tup_ret, tup_fetch, sessions = conn.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, tup_returned, tup_fetched, "
            "sessions "
            "FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        tables = {
            name: {"ins": ins, "upd": upd, "hot_upd": hot, "del": dele, "seq_scan": seq, "idx_scan": idx or 0}
            for name, ins, upd, hot, dele, seq, idx in conn.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, seq_scan, idx_scan "
                "FROM pg_stat_user_tables"
            ).fetchall()
        }
    return {
        "xact_commit": xact_commit,
        "xact_rollback": xact_rollback,
        "tup_inserted": tup_ins,
        "tup_updated": tup_upd,
        "tup_deleted": tup_del,
        "tup_returned": tup_ret,
        "tup_fetched": tup_fetch,
        "sessions": sessions,
        "tables": tables,
    }


# Every db_counters() call is itself one transaction on weft_bench (plus pg_stat_clear_snapshot: two).
STATS_READ_TRANSACTIONS = 3


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    delta = {k: after[k] - before[k] for k in after if k != "tables"}
    tables = {}
    for name, row in after["tables"].items():
        base = before["tables"].get(name, dict.fromkeys(row, 0))
        diff = {k: row[k] - base[k] for k in row}
        if any(diff.values()):
            tables[name] = diff
    delta["tables"] = tables
    return delta


def pgss_reset() -> None:
    with stats_connection() as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def pgss_top(limit: int = 25) -> list[dict[str, Any]]:
    with stats_connection() as conn:
        rows = conn.execute(
            "SELECT calls, rows, round(total_exec_time::numeric, 1), query FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "ORDER BY calls DESC LIMIT %s",
            [limit],
        ).fetchall()
    return [{"calls": c, "rows": r, "total_ms": float(t), "sql": q} for c, r, t, q in rows]


def settle_stats() -> None:
    """PostgreSQL 15 backends flush their statistics at most once a second (and on exit)."""
    from django.db import connections

    connections.close_all()
    time.sleep(1.5)


# ------------------------------------------------------------------------------------------ engine


class Engine:
    """ONE weft_engine subprocess, run as ``python -m django weft_engine`` from the repository root."""

    def __init__(self, engine_id: str, concurrency: int, verbosity: int, trace_out: Path | None, log: Path):
        command = [sys.executable, "-m"]
        if trace_out is not None:
            command += ["benchmarks.sqltrace", "--out", str(trace_out), "--"]
        else:
            command += ["django"]
        command += ["weft_engine", "--engine-id", engine_id, "--concurrency", str(concurrency), "-v", str(verbosity)]
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.settings"}
        self.engine_id = engine_id
        self.command = command
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 30.0) -> None:
        from weft_django.models import Engine as EngineRow

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"engine exited with {self.process.returncode}:\n{self.tail()}")
            if EngineRow.objects.filter(id=self.engine_id, stopped_at__isnull=True).exists():
                time.sleep(0.3)  # the LISTEN connection comes up right after registration
                return
            time.sleep(0.05)
        raise RuntimeError(f"engine did not register within {timeout}s:\n{self.tail()}")

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the engine process so far (all its threads), from /proc."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        self._log.close()
        return self.process.returncode

    def tail(self, lines: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text().splitlines()[-lines:])


# ------------------------------------------------------------------------------------------ scenarios


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def scenario_throughput(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    """The issue's scenario: the engine is up first, then one client starts N workflows as fast as it
    can (one weft.start() call each); timed from the first start to the last completion."""
    return _three_noop_run("throughput", options, stamp, engine_first=True)


def scenario_backlog(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    """The engine's own capacity: N workflows are started while no engine runs, then ONE engine is
    started and drains them; timed from the first step it starts to the last completion."""
    return _three_noop_run("backlog", options, stamp, engine_first=False)


def _start_all(n: int) -> float:
    from tqdm import tqdm

    import weft_django as weft
    from benchmarks.benchapp.workflows import three_noop

    began = time.monotonic()
    for i in tqdm(range(n), desc="start   ", unit="wf", leave=True):
        weft.start(three_noop, args=[i])
    return time.monotonic() - began


def _three_noop_run(name: str, options: argparse.Namespace, stamp: str, *, engine_first: bool) -> dict[str, Any]:
    from django.db import connection
    from tqdm import tqdm

    from benchmarks import sqltrace
    from weft_django.models import Workflow

    n = options.workflows
    steps = 3 * n
    RESULTS.mkdir(exist_ok=True)
    trace_out = RESULTS / f"{stamp}-{name}-engine-sql.json" if options.trace_sql else None
    log = RESULTS / f"{stamp}-{name}-engine.log"
    profile = RESULTS / f"{stamp}-{name}-engine-pyspy.txt" if options.py_spy else None

    settle_stats()
    if options.pgss:
        pgss_reset()
    before = db_counters()
    sqltrace.reset()
    client: dict[str, dict[str, Any]] = {}

    engine: Engine | None = None
    engine_boot_cpu: float | None = None  # known only when the engine is up before the work starts
    client_cpu0 = time.process_time()
    spy: subprocess.Popen[bytes] | None = None
    stalled = False
    done = 0
    try:
        if engine_first:
            engine = Engine("bench-1", options.engine_concurrency, options.engine_verbosity, trace_out, log)
            engine.wait_ready()
            engine_boot_cpu = engine.cpu_seconds()
            client["boot"] = sqltrace.snapshot()  # the readiness polling, not part of the starts
            sqltrace.reset()
            spy = _py_spy(engine, profile)
            clock0 = time.monotonic()
            start_seconds = _start_all(n)
        else:
            start_seconds = _start_all(n)
            if options.analyze:
                with connection.cursor() as cursor:
                    cursor.execute("ANALYZE")
            client["starts"] = sqltrace.snapshot()
            sqltrace.reset()
            clock0 = time.monotonic()
            engine = Engine("bench-1", options.engine_concurrency, options.engine_verbosity, trace_out, log)
            spy = _py_spy(engine, profile)
        if engine_first:
            client["starts"] = sqltrace.snapshot()
            sqltrace.reset()

        last_progress = time.monotonic()
        with tqdm(total=n, desc="complete", unit="wf", leave=True) as bar:
            while True:
                count = Workflow.objects.filter(status="completed").count()
                if count != done:
                    bar.update(count - done)
                    done = count
                    last_progress = time.monotonic()
                if done >= n:
                    break
                if not engine.alive():
                    raise RuntimeError(f"engine exited with {engine.process.returncode}:\n{engine.tail()}")
                if time.monotonic() - last_progress > STALL_SECONDS:
                    stalled = True
                    break
                time.sleep(POLL_SECONDS)
        client_seconds = time.monotonic() - clock0
        engine_cpu = engine.cpu_seconds()
        client["poll"] = sqltrace.snapshot()
        sqltrace.reset()
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its report on SIGINT
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
        code = engine.stop() if engine is not None else None
    if stalled:
        assert engine is not None
        raise RuntimeError(
            f"no progress for {STALL_SECONDS}s at {done}/{n} completed; engine log {log}:\n{engine.tail()}"
        )

    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT EXTRACT(EPOCH FROM w.finished_at - w.created_at),
                      EXTRACT(EPOCH FROM s.first_step - w.created_at)
               FROM weft_django_workflow w
               JOIN (SELECT workflow_id, min(started_at) AS first_step FROM weft_django_step GROUP BY workflow_id) s
                 ON s.workflow_id = w.id
               WHERE w.status = 'completed'"""
        )
        rows = cursor.fetchall()
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(created_at)), "
            "EXTRACT(EPOCH FROM max(finished_at) - (SELECT min(started_at) FROM weft_django_step)) "
            "FROM weft_django_workflow"
        )
        span_from_start, span_from_first_step = (float(v) for v in cursor.fetchone())
        cursor.execute("SELECT status, count(*) FROM weft_django_workflow GROUP BY status")
        statuses = dict(cursor.fetchall())
        cursor.execute("SELECT count(*) FROM weft_django_step WHERE status = 'completed'")
        committed_steps = cursor.fetchone()[0]
    client["results"] = sqltrace.snapshot()
    client_cpu = time.process_time() - client_cpu0
    latencies = [float(r[0]) for r in rows]
    first_step = [float(r[1]) for r in rows]

    settle_stats()
    after = db_counters()
    delta = counter_delta(before, after)
    client_tx = sum(c["transactions"] for c in client.values())
    engine_tx = delta["xact_commit"] - client_tx - STATS_READ_TRANSACTIONS
    writes = delta["tup_inserted"] + delta["tup_updated"] + delta["tup_deleted"]
    # throughput: from the first start (engine already up) or from the engine's first step (backlog)
    span = span_from_start if engine_first else span_from_first_step

    result: dict[str, Any] = {
        "scenario": name,
        "timed_from": "first start" if engine_first else "engine's first step",
        "workflows": n,
        "steps": steps,
        "committed_steps": committed_steps,
        "statuses": statuses,
        "engine_concurrency": options.engine_concurrency,
        "engine_command": " ".join(engine.command),
        "engine_exit_code": code,
        "engine_log": str(log),
        "engine_profile": str(profile) if profile else None,
        "sql_traced": bool(options.trace_sql),
        "analyzed_before_engine": bool(options.analyze) and not engine_first,
        "start_seconds": start_seconds,
        "starts_per_s": n / start_seconds,
        "starts_with_engine_running": engine_first,
        "total_seconds_client": client_seconds,
        "total_seconds_db": span,
        "span_first_start_to_last_completion": span_from_start,
        "span_first_step_to_last_completion": span_from_first_step,
        "workflows_per_s": n / span,
        "steps_per_s": steps / span,
        "latency_s": {
            "p50": percentile(latencies, 0.50),
            "p90": percentile(latencies, 0.90),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies, default=float("nan")),
            "mean": statistics.fmean(latencies) if latencies else float("nan"),
        },
        "first_step_delay_s": {
            "p50": percentile(first_step, 0.50),
            "p99": percentile(first_step, 0.99),
            "max": max(first_step, default=float("nan")),
        },
        "engine_cpu_seconds": engine_cpu,
        "engine_boot_cpu_seconds": engine_boot_cpu,
        "engine_cpu_ms_per_step": (
            (engine_cpu - (engine_boot_cpu or 0.0)) * 1000 / steps if engine_cpu is not None else None
        ),
        "client_cpu_seconds": client_cpu,
        "db": delta,
        "client": {
            "start_statements_per_start": client["starts"]["statements"] / n,
            "start_transactions_per_start": client["starts"]["transactions"] / n,
            "start_statement_shapes": client["starts"]["shapes"],
            "poll_transactions": client["poll"]["transactions"],
            "transactions_total": client_tx,
        },
        "engine_transactions": engine_tx,
        "engine_transactions_per_step": engine_tx / steps,
        "row_writes_per_step": writes / steps,
        "row_writes_per_step_engine": (writes - _start_row_writes(delta, n)) / steps,
    }
    if options.pgss:
        result["pg_stat_statements_top"] = pgss_top()
    if trace_out is not None and trace_out.exists():
        trace = json.loads(trace_out.read_text())
        result["engine_sql"] = {
            "statements": trace["statements"],
            "transactions": trace["transactions"],
            "write_transactions": trace["write_transactions"],
            "rollbacks": trace["rollbacks"],
            "statements_per_step": trace["statements"] / steps,
            "transactions_per_step": trace["transactions"] / steps,
            "write_transactions_per_step": trace["write_transactions"] / steps,
            "by_thread": trace["by_thread"],
            "top_shapes": trace["shapes"][:25],
        }
    return result


def _py_spy(engine: Engine, out: Path | None) -> subprocess.Popen[bytes] | None:
    """Sample the engine with py-spy (``--py-spy``) until the scenario ends: collapsed stacks of every
    thread, idle samples included (wall-clock time: where the main loop waits, not only its CPU)."""
    if out is None:
        return None
    binary = Path(sys.executable).with_name("py-spy")
    if not binary.exists():
        raise RuntimeError("--py-spy needs py-spy in the venv: pip install py-spy")
    return subprocess.Popen(
        [
            str(binary),
            "record",
            "--pid",
            str(engine.process.pid),
            "--format",
            "raw",
            "--rate",
            "200",
            "--threads",
            "--idle",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _start_row_writes(delta: dict[str, Any], n: int) -> int:
    """Rows the client's starts inserted: the workflow rows and their claim rows (only starts insert them)."""
    tables = delta["tables"]
    return sum(tables.get(t, {}).get("ins", 0) for t in ("weft_django_workflow", "weft_django_workflowclaim"))


SCENARIOS = {"throughput": scenario_throughput, "backlog": scenario_backlog}


# ------------------------------------------------------------------------------------------ report


def machine(server: dict[str, Any]) -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import django

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"

    dirty = git("status", "--porcelain", "--", "weft_django")
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "git": git("rev-parse", "--short", "HEAD") + (" + uncommitted changes in weft_django/" if dirty else ""),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "loadavg_before": list(os.getloadavg()),
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgresql": server["server_version"],
        "pg_settings": server["settings"],
        "platform": platform.platform(),
    }


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def report(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "weft_django benchmarks",
        table(
            [
                ("date", meta["date"]),
                ("machine", f"{meta['nproc']} CPUs ({meta['cpu']}), load avg before {meta['loadavg_before'][0]:.2f}"),
                (
                    "PostgreSQL",
                    f"{meta['postgresql']} (synchronous_commit={meta['pg_settings'].get('synchronous_commit')}, "
                    f"fsync={meta['pg_settings'].get('fsync')}), same machine",
                ),
                ("code", meta["git"]),
                ("Python / Django", f"{meta['python']} / {meta['django']}, CONN_MAX_AGE={meta['conn_max_age']}"),
                ("statement counts", meta["statement_source"]),
            ]
        ),
    ]
    for r in results:
        lat, first = r["latency_s"], r["first_step_delay_s"]
        db = r["db"]
        rows = [
            ("workflows (3 no-op activities each)", f"{r['workflows']}  ({r['statuses']})"),
            (
                "engine",
                f"1 subprocess, --concurrency {r['engine_concurrency']}, POLL_INTERVAL 100ms"
                f"{', SQL traced' if r['sql_traced'] else ''}"
                f"{', ANALYZE after the starts' if r.get('analyzed_before_engine') else ''}",
            ),
            (
                "start phase (1 client, sequential)",
                f"{r['start_seconds']:.2f} s  = {r['starts_per_s']:.0f} starts/s "
                f"({'engine running' if r['starts_with_engine_running'] else 'no engine'})",
            ),
            (
                f"{r['timed_from']} -> last completion",
                f"{r['total_seconds_db']:.2f} s (db clock); "
                f"{r['total_seconds_client']:.2f} s (client, 50 ms polls"
                f"{'' if r['starts_with_engine_running'] else ', from engine spawn'})",
            ),
            ("throughput", f"{r['workflows_per_s']:.1f} workflows/s = {r['steps_per_s']:.1f} steps/s"),
            (
                "latency created -> finished",
                f"p50 {lat['p50']:.2f} s  p90 {lat['p90']:.2f} s  p99 {lat['p99']:.2f} s  max {lat['max']:.2f} s",
            ),
            (
                "created -> first step started",
                f"p50 {first['p50']:.2f} s  p99 {first['p99']:.2f} s  max {first['max']:.2f} s",
            ),
            (
                "engine CPU (user+sys, whole process)",
                (
                    f"{r['engine_cpu_seconds']:.2f} s; "
                    + (
                        f"{r['engine_cpu_seconds'] - r['engine_boot_cpu_seconds']:.2f} s after start-up"
                        if r["engine_boot_cpu_seconds"] is not None
                        else "start-up included"
                    )
                    + f" = {r['engine_cpu_ms_per_step']:.2f} ms per step"
                )
                if r["engine_cpu_seconds"] is not None
                else "n/a",
            ),
            ("client CPU (this process)", f"{r['client_cpu_seconds']:.2f} s"),
            (
                "transactions, whole database",
                f"{db['xact_commit']} commits, {db['xact_rollback']} rollbacks, {db['sessions']} connections opened",
            ),
            (
                "  of which client",
                f"{r['client']['transactions_total']} "
                f"({r['client']['start_transactions_per_start']:.2f}/start, "
                f"{r['client']['start_statements_per_start']:.2f} statements/start; "
                f"{r['client']['poll_transactions']} progress polls)",
            ),
            (
                "  of which engine (the rest)",
                f"{r['engine_transactions']}  = {r['engine_transactions_per_step']:.2f} per committed step",
            ),
            (
                "row writes (ins+upd+del)",
                f"{db['tup_inserted']}+{db['tup_updated']}+{db['tup_deleted']}  = "
                f"{r['row_writes_per_step']:.2f} per step "
                f"({r['row_writes_per_step_engine']:.2f} excluding the starts' rows)",
            ),
        ]
        for name, t in sorted(db["tables"].items()):
            short = name.replace("weft_django_", "")
            rows.append(
                (
                    f"  {short}",
                    f"ins {t['ins']}  upd {t['upd']} (hot {t['hot_upd']})  del {t['del']}  "
                    f"seq_scan {t['seq_scan']}  idx_scan {t['idx_scan']}",
                )
            )
        if "engine_sql" in r:
            e = r["engine_sql"]
            rows += [
                (
                    "engine SQL (traced)",
                    f"{e['statements']} statements = {e['statements_per_step']:.2f}/step; "
                    f"{e['transactions']} transactions = {e['transactions_per_step']:.2f}/step "
                    f"({e['write_transactions_per_step']:.2f} writing)",
                ),
            ]
            for thread, t in e["by_thread"].items():
                rows.append((f"  thread {thread}", f"{t['statements']} statements, {t['transactions']} transactions"))
        lines += ["", f"scenario: {r['scenario']}", table(rows)]
        if "engine_sql" in r:
            lines += ["", "  engine statements by shape (calls, per step, thread, SQL):"]
            for s in r["engine_sql"]["top_shapes"][:15]:
                sql = s["sql"] if len(s["sql"]) <= 110 else s["sql"][:107] + "..."
                lines.append(f"  {s['calls']:>7}  {s['calls'] / r['steps']:5.2f}  {s['thread']:<12}  {sql}")
        if "pg_stat_statements_top" in r:
            lines += ["", "  pg_stat_statements (calls, SQL):"]
            for s in r["pg_stat_statements_top"][:15]:
                lines.append(f"  {s['calls']:>7}  {' '.join(s['sql'].split())[:110]}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--scenarios", default="throughput", help=f"comma-separated: {', '.join(SCENARIOS)}")
    parser.add_argument("--engine-concurrency", type=int, default=8)
    parser.add_argument("--engine-verbosity", type=int, default=1, help="weft_engine -v (2 = INFO logs)")
    parser.add_argument(
        "--conn-max-age",
        default=None,
        help='CONN_MAX_AGE for the client and the engine: seconds, or "none" for persistent '
        "connections (default: Django's default, 0)",
    )
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="backlog: ANALYZE the database after the starts, before the engine starts "
        "(planner statistics as a long-running database would have them)",
    )
    parser.add_argument(
        "--py-spy", action="store_true", help="sample the engine with py-spy; collapsed stacks in benchmarks/results/"
    )
    parser.add_argument(
        "--trace-sql",
        action="store_true",
        help="count the engine's statements by shape (Django execute wrapper in the engine)",
    )
    options = parser.parse_args(argv)
    scenarios = [s.strip() for s in options.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")

    if options.conn_max_age is not None:
        os.environ["WEFT_BENCH_CONN_MAX_AGE"] = options.conn_max_age  # read by settings.py, inherited by the engine
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from benchmarks import sqltrace

    recreate_database()
    call_command("migrate", verbosity=0)
    server = server_facts()
    options.pgss = server["pg_stat_statements"]
    meta = machine(server)
    meta["statement_source"] = (
        "pg_stat_statements"
        if options.pgss
        else "pg_stat_statements not preloaded: transactions from pg_stat_database.xact_commit, row writes from "
        "pg_stat_user_tables" + ("; engine statements traced in-process (--trace-sql)" if options.trace_sql else "")
    )
    meta["conn_max_age"] = settings.DATABASES["default"]["CONN_MAX_AGE"]
    meta["command"] = " ".join(["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])])
    sqltrace.install()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    results = []
    for index, name in enumerate(scenarios):
        if index:
            call_command("flush", interactive=False, verbosity=0)
        results.append(SCENARIOS[name](options, stamp))
    meta["loadavg_after"] = list(os.getloadavg())
    print(report(meta, results))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}.json"
    out.write_text(json.dumps({"machine": meta, "results": results}, indent=1, default=str))
    print(f"\nwritten: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
