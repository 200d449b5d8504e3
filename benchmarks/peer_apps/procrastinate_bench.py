"""Procrastinate driver for benchmarks/peers.py (run as a subprocess from .venv-bench; writes one JSON).

    python -m benchmarks.peer_apps.procrastinate_bench --out FILE [--workflows 1000]

Database ``weft_peer_procrastinate`` (dropped, re-created, schema applied). ONE worker subprocess:
``procrastinate --app=benchmarks.peer_apps.procrastinate_app.app worker --concurrency 8`` (LISTEN/NOTIFY
on, defaults otherwise). (a) only: one client defers N ``step(i, k=1)`` jobs sequentially
(``defer_async``, one transaction each); each job defers its successor; timed until a 20 ms poll
sees N succeeded jobs with k=3.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.peer_apps import common

ROOT = Path(__file__).resolve().parents[2]
DBNAME = common.DATABASES["procrastinate"]


def _done_count(conn: Any) -> int:
    return conn.execute(
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded' AND (args->>'k')::int = 3"
    ).fetchone()[0]


async def _defer_all(n: int, progress: bool) -> float:
    from tqdm import tqdm

    from benchmarks.peer_apps.procrastinate_app import app, step

    async with app.open_async():
        t0 = time.perf_counter()
        for i in tqdm(range(n), desc="procrastinate a", disable=not progress, leave=False):
            await step.defer_async(i=i, k=1)
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--stamp", default=time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    import procrastinate
    import psycopg

    progress = not args.no_progress
    common.recreate_database(DBNAME)
    exe = str(Path(sys.executable).with_name("procrastinate"))
    app_path = "benchmarks.peer_apps.procrastinate_app.app"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the console script does not put the cwd on sys.path
    subprocess.run([exe, f"--app={app_path}", "schema", "--apply"], cwd=ROOT, env=env, check=True, capture_output=True)
    log_path = ROOT / "benchmarks" / "results" / f"{args.stamp}-peers-procrastinate-worker.log"
    log_path.parent.mkdir(exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115
    command = [exe, f"--app={app_path}", "worker", "--concurrency", str(args.concurrency), "--queues", "bench"]
    worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    result: dict[str, Any] = {
        "system": "Procrastinate",
        "version": procrastinate.__version__ if hasattr(procrastinate, "__version__") else "",
        "database": DBNAME,
        "worker_command": " ".join(["procrastinate", *command[1:]]),
    }
    n = args.workflows
    try:
        with psycopg.connect(common.conninfo(DBNAME), autocommit=True) as conn:
            # warm-up and readiness: one chain through the worker
            asyncio.run(_defer_all(1, False))
            common.wait_until(lambda: _done_count(conn) >= 1, 60, 0.05, "procrastinate worker ready")
            time.sleep(1.0)
            before = common.db_counters(DBNAME)
            base = _done_count(conn)
            cpu0 = common.proc_cpu_seconds(worker.pid)
            t0 = time.perf_counter()
            start_seconds = asyncio.run(_defer_all(n, progress))
            deadline = time.monotonic() + 300
            while _done_count(conn) - base < n:
                if worker.poll() is not None:
                    raise RuntimeError(f"worker exited: see {log_path}")
                if time.monotonic() > deadline:
                    raise TimeoutError("procrastinate: not done after 300 s")
                time.sleep(0.02)
            t_end = time.perf_counter()
            cpu1 = common.proc_cpu_seconds(worker.pid)
        result["a"] = common.throughput_summary(n, start_seconds, t_end - t0)
        result["a"]["worker_cpu_ms_per_step"] = (cpu1 - cpu0) * 1000 / (3 * n) if cpu0 is not None and cpu1 else None
        time.sleep(1.5)
        d = common.delta(before, common.db_counters(DBNAME))
        result["a"]["db"] = d
        result["a"]["db_commits_per_step"] = d["xact_commit"] / (3 * n)
        result["a"]["row_writes_per_step"] = (d["tup_inserted"] + d["tup_updated"] + d["tup_deleted"]) / (3 * n)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(30)
        log.close()
    common.drop_database(DBNAME)
    common.write_result(args.out, result)


if __name__ == "__main__":
    main()
