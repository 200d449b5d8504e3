"""Celery driver for benchmarks/peers.py (run as a subprocess from .venv-bench; writes one JSON result).

    python -m benchmarks.peer_apps.celery_bench --out FILE [--workflows 1000] [--latency 200]

Redis database WEFT_BENCH_REDIS_URL (default redis://127.0.0.1:6379/11) is flushed first. ONE worker
subprocess: ``celery -A benchmarks.peer_apps.celery_app worker -c 8 --loglevel WARNING`` (prefork).
(a) ``chain(noop, add_one, add_one).apply_async()`` N times from one client, then ``.get()`` on every
    chain's last result; (b) one at a time, ``apply_async().get()``. No durable state in PostgreSQL:
    Celery is the at-least-once task queue baseline, not a durable workflow engine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.peer_apps import common

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--latency", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--stamp", default=time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    import redis
    from tqdm import tqdm

    progress = not args.no_progress
    redis.Redis.from_url(common.REDIS_URL).flushdb()
    from benchmarks.peer_apps.celery_app import app, three_noop

    log_path = ROOT / "benchmarks" / "results" / f"{args.stamp}-peers-celery-worker.log"
    log_path.parent.mkdir(exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115
    command = [
        str(Path(sys.executable).with_name("celery")),
        "-A",
        "benchmarks.peer_apps.celery_app",
        "worker",
        "-c",
        str(args.concurrency),
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "-n",
        f"peer-bench-{os.getpid()}@%h",
    ]
    worker = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    import celery

    result: dict[str, Any] = {
        "system": "Celery",
        "version": celery.__version__,
        "worker_command": " ".join(["celery", *command[1:]]),
        "broker": common.REDIS_URL,
    }
    n = args.workflows
    try:
        common.wait_until(lambda: bool(app.control.ping(timeout=0.5)), 60, 0.2, "celery worker ping")
        for i in range(5):  # warm-up: every pool process imports the tasks
            three_noop(i).apply_async().get(timeout=30)
        time.sleep(1.0)
        cpu0 = common.tree_cpu_seconds(worker.pid)
        t0 = time.perf_counter()
        handles = [
            three_noop(i).apply_async() for i in tqdm(range(n), desc="celery a", disable=not progress, leave=False)
        ]
        t_started = time.perf_counter()
        for i, h in enumerate(handles):
            assert h.get(timeout=120) == i + 2
        t_end = time.perf_counter()
        cpu1 = common.tree_cpu_seconds(worker.pid)
        result["a"] = common.throughput_summary(n, t_started - t0, t_end - t0)
        result["a"]["worker_cpu_ms_per_step"] = (cpu1 - cpu0) * 1000 / (3 * n) if cpu0 and cpu1 else None
        times = []
        for i in tqdm(range(args.latency), desc="celery one-at-a-time", disable=not progress, leave=False):
            t0 = time.perf_counter()
            three_noop(i).apply_async().get(timeout=30)
            times.append(time.perf_counter() - t0)
        result["b"] = common.latency_summary(times)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(30)
        log.close()
    redis.Redis.from_url(common.REDIS_URL).flushdb()
    common.write_result(args.out, result)


if __name__ == "__main__":
    main()
