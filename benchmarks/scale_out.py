"""Engines scale out: throughput with 1, 2 and 4 engines on one PostgreSQL (issue 16, item 5).

    PYTHONPATH=$PWD python -m benchmarks.scale_out [--engines 1,2,4] [--workflows 6000] [--workflow bench.three_noop]

Database ``<WEFT_BENCH_PEER_PREFIX>scale``, re-created for each engine count. N workflows are started
while no engine runs (a backlog), then K engine subprocesses start together (``OWNERSHIP``
"workflow-lease", everything else at its default but ``POLL_INTERVAL`` 100ms). Throughput is
completions per second over the middle of the drain (between the 20th and the 90th percentile of
``finished_at``, database clock), so the engines' staggered start-up does not count. During the drain
the benchmark samples, every 20 ms, ``pg_stat_activity`` of the database (each backend's state and wait
event) and reads the CPU time of the whole machine (/proc/stat), of the engines and of the PostgreSQL
processes (/proc), to show which resource is the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.peer_apps import common

ROOT = Path(__file__).resolve().parents[1]
DBNAME = os.environ.get("WEFT_BENCH_PEER_PREFIX", "weft_peer_") + "scale"
TICK = os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the machine so far."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / TICK, sum(fields) / TICK


def backends_cpu(pids: set[int]) -> float:
    """CPU seconds of these PostgreSQL backends (this database's, seen by the sampler) so far."""
    total = 0.0
    for pid in pids:
        try:
            parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(parts[11]) + int(parts[12])) / TICK
    return total


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self.pids: set[int] = set()

    def run(self) -> None:
        import psycopg

        with psycopg.connect(common.conninfo(DBNAME), autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT pid, state, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                    [DBNAME],
                ).fetchall()
                self.samples += 1
                for pid, state, kind, event in rows:
                    self.pids.add(pid)
                    if state == "active":
                        self.counts["active: " + (f"{kind}/{event}" if kind else "on CPU")] += 1
                time.sleep(0.02)


def run_once(k: int, n: int, workflow: str, log_dir: Path) -> dict[str, Any]:
    from django.db import connection, connections

    common.recreate_database(DBNAME)
    connections.close_all()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import weft_django as weft

    t0 = time.monotonic()
    for i in range(n):
        weft.start(workflow, args=[i])
    start_seconds = time.monotonic() - t0
    env = dict(os.environ, WEFT_BENCH_OVERRIDES=json.dumps({"POLL_INTERVAL": "100ms"}))
    sampler = Sampler()
    busy0, total0 = machine_cpu()
    procs = []
    for i in range(k):
        command = [sys.executable, "-m", "django", "weft_engine", "--engine-id", f"scale-{k}-{i + 1}", "-v", "1"]
        log = (log_dir / f"scale-{k}-{i + 1}.log").open("w")
        procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    sampler.start()
    from weft_django.models import Workflow

    try:
        common.wait_until(
            lambda: Workflow.objects.filter(status="completed").count() >= n, 600, interval=0.2, what="drained"
        )
        busy1, total1 = machine_cpu()
        pg_cpu = backends_cpu(sampler.pids)  # the engines' backends started with them: all of their CPU
        engine_cpu = sum(common.tree_cpu_seconds(p.pid) or 0.0 for p in procs)
    finally:
        sampler.stop.set()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT percentile_disc(0.2) WITHIN GROUP (ORDER BY finished_at), "
            f"percentile_disc(0.9) WITHIN GROUP (ORDER BY finished_at), min(created_at), max(finished_at) "
            f"FROM {Workflow._meta.db_table}"
        )
        p20, p90, _first, last = cursor.fetchone()
    window = (p90 - p20).total_seconds()
    wall = total1 - total0
    samples = max(sampler.samples, 1)
    waits = {name: round(count / samples, 2) for name, count in sampler.counts.most_common(8)}
    return {
        "engines": k,
        "workflows": n,
        "client_starts_per_s": n / start_seconds,
        "throughput_wf_s": 0.7 * n / window if window > 0 else float("nan"),
        "drain_seconds_db": (last - p20).total_seconds(),
        "machine_busy_pct": round((busy1 - busy0) * 100 / wall, 1),
        "machine_cores": os.cpu_count(),
        "engines_cpu_s": round(engine_cpu, 2),
        "postgres_cpu_s": round(pg_cpu, 2),
        "ours_pct_of_machine": round((engine_cpu + pg_cpu) * 100 / wall, 1),
        "wall_cpu_capacity_s": round(wall, 2),
        "active_backends_avg_by_wait": waits,
        "loadavg": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="1,2,4")
    parser.add_argument("--workflows", type=int, default=6000)
    parser.add_argument("--workflow", default="bench.three_noop")
    args = parser.parse_args()
    os.environ["WEFT_BENCH_PG_NAME"] = DBNAME
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    common.recreate_database(DBNAME)
    import django

    django.setup()
    log_dir = ROOT / "benchmarks" / "results"
    log_dir.mkdir(exist_ok=True)
    results = []
    for k in [int(x) for x in args.engines.split(",")]:
        result = run_once(k, args.workflows, args.workflow, log_dir)
        print(json.dumps(result), flush=True)
        results.append(result)
    print(f"\n{args.workflows} x {args.workflow}, backlog drained by K engines, one PostgreSQL, {os.cpu_count()} CPUs")
    print(
        "| engines | wf/s (middle 70 %) | vs 1 engine | machine CPU busy | engines + their backends, % of machine |"
        " engines CPU s | backends CPU s | active backends (avg) by wait event |"
    )
    print("|---|---|---|---|---|---|---|---|")
    base = results[0]["throughput_wf_s"]
    for r in results:
        waits = "; ".join(f"{k} {v}" for k, v in r["active_backends_avg_by_wait"].items())
        print(
            f"| {r['engines']} | {r['throughput_wf_s']:.0f} | {r['throughput_wf_s'] / base:.2f}x | "
            f"{r['machine_busy_pct']} % | {r['ours_pct_of_machine']} % | {r['engines_cpu_s']} | {r['postgres_cpu_s']} "
            f"| {waits} |"
        )
    out = log_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-scale-out.json"
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
