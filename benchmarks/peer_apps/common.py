"""Helpers shared by the peer drivers: PostgreSQL connection facts, database re-creation, percentiles."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

PG_HOST = os.environ.get("WEFT_BENCH_PG_HOST", "127.0.0.1")
PG_PORT = os.environ.get("WEFT_BENCH_PG_PORT", "5432")
PG_USER = os.environ.get("WEFT_BENCH_PG_USER", "postgres")
REDIS_URL = os.environ.get("WEFT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")

# One database per system, dropped and re-created by each run (WEFT_BENCH_PEER_PREFIX: runs side by side).
_PREFIX = os.environ.get("WEFT_BENCH_PEER_PREFIX", "weft_peer_")
DATABASES = {name: f"{_PREFIX}{name}" for name in ("weft", "dbos", "procrastinate", "raw")}


def conninfo(dbname: str) -> str:
    return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{dbname}"


def recreate_database(name: str) -> None:
    import psycopg

    with psycopg.connect(conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def db_counters(name: str) -> dict[str, int]:
    """pg_stat_database counters of one database (PostgreSQL 15 flushes backend stats about once a second)."""
    import psycopg

    with psycopg.connect(conninfo(name), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, sessions "
            "FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    keys = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "sessions")
    return dict(zip(keys, row, strict=True))


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def latency_summary(seconds: list[float]) -> dict[str, float]:
    """Per-item latencies (seconds) -> ms percentiles and the sequential rate."""
    return {
        "n": len(seconds),
        "p50_ms": percentile(seconds, 0.50) * 1000,
        "p90_ms": percentile(seconds, 0.90) * 1000,
        "p99_ms": percentile(seconds, 0.99) * 1000,
        "max_ms": max(seconds, default=float("nan")) * 1000,
        "mean_ms": (statistics.fmean(seconds) * 1000) if seconds else float("nan"),
        "per_s": len(seconds) / sum(seconds) if seconds else float("nan"),
    }


def throughput_summary(n: int, start_seconds: float, total_seconds: float) -> dict[str, float]:
    return {
        "n": n,
        "start_seconds": start_seconds,
        "starts_per_s": n / start_seconds,
        "total_seconds": total_seconds,
        "workflows_per_s": n / total_seconds,
    }


def proc_cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU of a process and its live children (Celery's prefork pool)."""
    total = proc_cpu_seconds(pid)
    if total is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        total += tree_cpu_seconds(int(child)) or 0.0
    return total


def write_result(path: str, result: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(result, indent=1, default=str))


def wait_until(predicate: Any, timeout: float, interval: float = 0.02, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached within {timeout}s")
