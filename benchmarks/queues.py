"""Queues: weft_django against DBOS in ONE run, against the same PostgreSQL (each system its own
database, dropped and re-created), back to back, each in its own subprocess.

    /work/venv-bench/bin/python -m benchmarks.queues [--workflows 2000] [--drain 10000] [--concurrency 10]
                                                     [--systems weft,dbos]

(overhead) N three-no-op workflows started one after another by one client and run to completion,
    without a queue and in a queue without limits: what admission costs.
(drain) N workflows already waiting in a queue of concurrency C, drained by one engine / executor.
Prints one table, every figure also as a ratio to weft_django's, and writes
``benchmarks/results/<timestamp>-queues.json``. Drivers: benchmarks/peer_apps/weft_queue_bench.py,
benchmarks/peer_apps/dbos_queue_bench.py. Databases: WEFT_BENCH_PEER_PREFIX (default
``weft_queues_peer_``) + system.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DRIVERS = {"weft": "benchmarks.peer_apps.weft_queue_bench", "dbos": "benchmarks.peer_apps.dbos_queue_bench"}
ROWS = (
    ("no_queue", "workflows_per_s", "no queue: workflows/s"),
    ("no_queue", "starts_per_s", "no queue: starts/s"),
    ("queue_no_limits", "workflows_per_s", "queue, no limits: workflows/s"),
    ("queue_no_limits", "starts_per_s", "queue, no limits: starts/s"),
    ("drain", "enqueue_per_s", "drain: enqueued/s (no executor running)"),
    ("drain", "drained_per_s", "drain at concurrency C: workflows/s (db clock)"),
    ("drain", "drain_seconds_db", "drain: seconds (db clock)"),
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--drain", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--systems", default="weft,dbos")
    args = parser.parse_args()
    os.environ.setdefault("WEFT_BENCH_PEER_PREFIX", "weft_queues_peer_")
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {}
    for system in args.systems.split(","):
        out = RESULTS / f"{stamp}-queues-{system}.json"
        command = [sys.executable, "-m", DRIVERS[system], "--out", str(out), "--workflows", str(args.workflows)]
        command += ["--drain", str(args.drain), "--concurrency", str(args.concurrency)]
        load = os.getloadavg()
        print(f"== {system} (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", flush=True)
        code = subprocess.run(command, cwd=ROOT).returncode
        if code != 0 or not out.exists():
            results[system] = {"error": f"exit code {code}", "loadavg_before": load}
            continue
        results[system] = {**json.loads(out.read_text()), "loadavg_before": load}
    (RESULTS / f"{stamp}-queues.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    systems = [s for s in results if "error" not in results[s]]
    base = results.get("weft", {})
    print(f"\nqueues: N={args.workflows}, drain {args.drain} at concurrency {args.concurrency}")
    print(f"{'figure':<48}" + "".join(f"{s:>14}{'ratio':>8}" for s in systems))
    for part, key, label in ROWS:
        line = f"{label.replace('C', str(args.concurrency)):<48}"
        for system in systems:
            value = results[system].get(part, {}).get(key)
            mine = base.get(part, {}).get(key)
            ratio = f"{value / mine:.2f}" if value and mine else "-"
            line += f"{value:>14.1f}{ratio:>8}" if value is not None else f"{'-':>14}{'-':>8}"
        print(line)
    if "weft" in results and "error" not in results["weft"]:
        weft = results["weft"]
        cost = weft["no_queue"]["workflows_per_s"] / weft["queue_no_limits"]["workflows_per_s"]
        print(
            f"\nweft: a queue without limits costs {cost:.2f}x the time of no queue; at most "
            f"{weft['drain']['most_admitted_at_once']} admitted at once during the drain (limit {args.concurrency})"
        )
    print(f"\nresults: {RESULTS / f'{stamp}-queues.json'}")


if __name__ == "__main__":
    main()
