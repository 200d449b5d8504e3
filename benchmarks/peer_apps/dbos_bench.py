"""DBOS driver for benchmarks/peers.py (run as a subprocess from .venv-bench; writes one JSON result).

    python -m benchmarks.peer_apps.dbos_bench --out FILE [--workflows 1000] [--latency 200] [--signals 200]

Database ``weft_peer_dbos`` (dropped and re-created; DBOS migrates its system schema at launch). DBOS is
a library: the process that starts workflows also executes them (one DBOS executor = this process).
Defaults otherwise (LISTEN/NOTIFY on, sys_db_pool_size default).

(a) ``DBOS.start_workflow(three_noop, i)`` N times as fast as one thread can, then every handle's
    ``get_result()``; and (a, queue) the same with ``queue.enqueue(...)`` on a queue registered with
    ``polling_interval_sec`` (default 0.1 here; DBOS's default is 1.0) and no concurrency limit.
(b) one at a time: ``DBOS.start_workflow(three_noop, i).get_result()``.
(c) M ``parked`` workflows wait in ``DBOS.recv("go")``; one at a time ``DBOS.send(id, i, "go")`` then
    ``handle.get_result()``, timed from before send() to the return of get_result().
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from benchmarks.peer_apps import common

DBNAME = common.DATABASES["dbos"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--latency", type=int, default=200)
    parser.add_argument("--signals", type=int, default=200)
    parser.add_argument("--queue-polling", type=float, default=0.1)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    from tqdm import tqdm

    progress = not args.no_progress

    common.recreate_database(DBNAME)
    import dbos
    from dbos import DBOS, DBOSConfig

    from benchmarks.peer_apps.dbos_app import parked, three_noop

    config: DBOSConfig = {
        "name": "weft-peer-bench",
        "system_database_url": common.conninfo(DBNAME),
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    queue = DBOS.register_queue("bench", polling_interval_sec=args.queue_polling)
    result: dict[str, Any] = {
        "system": "DBOS",
        "version": dbos.__version__ if hasattr(dbos, "__version__") else _version("dbos"),
        "database": DBNAME,
        "queue_polling_interval_sec": args.queue_polling,
    }
    pid = os.getpid()
    n = args.workflows
    try:
        # warm-up: first calls pay lazy set-up (connections, registrations)
        for i in range(5):
            DBOS.start_workflow(three_noop, i).get_result()

        for label, start in (
            ("a", lambda i: DBOS.start_workflow(three_noop, i)),
            ("a_queue", lambda i: queue.enqueue(three_noop, i)),
        ):
            time.sleep(1.0)
            before = common.db_counters(DBNAME)
            cpu0 = common.proc_cpu_seconds(pid)
            t0 = time.perf_counter()
            handles = [start(i) for i in tqdm(range(n), desc=f"dbos {label}", disable=not progress, leave=False)]
            t_started = time.perf_counter()
            for i, h in enumerate(handles):
                assert h.get_result() == i + 2
            t_end = time.perf_counter()
            cpu1 = common.proc_cpu_seconds(pid)
            time.sleep(1.5)
            d = common.delta(before, common.db_counters(DBNAME))
            out = common.throughput_summary(n, t_started - t0, t_end - t0)
            out["process_cpu_ms_per_step"] = (cpu1 - cpu0) * 1000 / (3 * n)
            out["db"] = d
            out["db_commits_per_step"] = d["xact_commit"] / (3 * n)
            out["row_writes_per_step"] = (d["tup_inserted"] + d["tup_updated"] + d["tup_deleted"]) / (3 * n)
            result[label] = out

        times = []
        for i in tqdm(range(args.latency), desc="dbos one-at-a-time", disable=not progress, leave=False):
            t0 = time.perf_counter()
            DBOS.start_workflow(three_noop, i).get_result()
            times.append(time.perf_counter() - t0)
        result["b"] = common.latency_summary(times)

        handles = [DBOS.start_workflow(parked, i) for i in range(args.signals)]
        for h in handles:
            assert DBOS.get_event(h.workflow_id, "parked", timeout_seconds=60) is True
        time.sleep(1.0)
        times = []
        for i, h in enumerate(tqdm(handles, desc="dbos signal", disable=not progress, leave=False)):
            t0 = time.perf_counter()
            DBOS.send(h.workflow_id, i, topic="go")
            value = h.get_result()
            times.append(time.perf_counter() - t0)
            assert value == [i, i], value
        result["c"] = common.latency_summary(times)
    finally:
        DBOS.destroy(destroy_registry=True)
    common.drop_database(DBNAME)
    common.write_result(args.out, result)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
