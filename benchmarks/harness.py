"""What every benchmark scenario shares: the results folder, database counters, the engine subprocess
(``EngineProcess``), percentiles and the report table. Imported by run.py and the modules of its
scenarios and report (throughput.py, takeover.py, run_report.py, scale.py), one way: harness.py
imports none of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


class EngineProcess:
    """ONE weft_engine subprocess, run as ``python -m django weft_engine`` from the repository root."""

    def __init__(
        self,
        engine_id: str,
        concurrency: int,
        verbosity: int,
        trace_out: Path | None,
        log: Path,
        weft: dict[str, Any] | None = None,
    ):
        command = [sys.executable, "-m"]
        if trace_out is not None:
            command += ["benchmarks.sqltrace", "--out", str(trace_out), "--"]
        else:
            command += ["django"]
        command += ["weft_engine", "--engine-id", engine_id, "--concurrency", str(concurrency), "-v", str(verbosity)]
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.settings"}
        self.weft = dict(weft or {})
        if self.weft:
            env["WEFT_BENCH_OVERRIDES"] = json.dumps(self.weft)  # merged into WEFT by benchmarks/settings.py
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


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
