"""DBOS queue driver for benchmarks/queues.py (a subprocess from the bench venv; writes one JSON result).

    python -m benchmarks.peer_apps.dbos_queue_bench --out FILE [--workflows 2000] [--drain 10000]
                                                    [--concurrency 10]

Database ``weft_peer_dbos`` (dropped and re-created). DBOS is a library: the launched process executes
the workflows. Workload ``three_noop`` (three no-op steps, benchmarks/peer_apps/dbos_app.py).

(overhead) ``DBOS.start_workflow(three_noop, i)`` N times, then every ``get_result()``; then
    ``queue.enqueue(three_noop, i)`` on a queue with no limits (``polling_interval_sec`` 0.1; DBOS's
    default is 1.0).
(drain) a ``DBOSClient`` (no executor) enqueues N on queue "capped"; then an executor is launched and
    registers the queue (``concurrency=C``), timed from the registration to the last result, and on the
    database clock from the first dequeue (``started_at_epoch_ms``) to the last update.
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
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--drain", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--queue-polling", type=float, default=0.1)
    args = parser.parse_args()
    common.recreate_database(DBNAME)
    from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions

    from benchmarks.peer_apps.dbos_app import three_noop

    config: DBOSConfig = {
        "name": "weft-peer-bench",
        "system_database_url": common.conninfo(DBNAME),
        "log_level": "WARNING",
    }
    result: dict[str, Any] = {
        "system": "DBOS",
        "version": _version("dbos"),
        "queue_polling_interval_sec": args.queue_polling,
    }
    n = args.workflows
    DBOS(config=config)
    DBOS.launch()
    free = DBOS.register_queue("free", polling_interval_sec=args.queue_polling)
    logging.getLogger("dbos").setLevel(logging.WARNING)
    try:
        for i in range(20):
            DBOS.start_workflow(three_noop, i).get_result()
        for label, start in (
            ("no_queue", lambda i: DBOS.start_workflow(three_noop, i)),
            ("queue_no_limits", lambda i: free.enqueue(three_noop, i)),
        ):
            time.sleep(1.0)
            t0 = time.perf_counter()
            handles = [start(i) for i in range(n)]
            t_started = time.perf_counter()
            for i, handle in enumerate(handles):
                assert handle.get_result() == i + 2
            result[label] = common.throughput_summary(n, t_started - t0, time.perf_counter() - t0)
    finally:
        DBOS.destroy(destroy_registry=False)
    # drain: enqueue with a client (no executor), then launch an executor
    client = DBOSClient(system_database_url=common.conninfo(DBNAME))
    options: EnqueueOptions = {"queue_name": "capped", "workflow_name": three_noop.__qualname__}
    t0 = time.perf_counter()
    ids = [client.enqueue(options, i).workflow_id for i in range(args.drain)]
    enqueue = time.perf_counter() - t0
    client.destroy()
    DBOS(config=config)
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    t1 = time.perf_counter()
    DBOS.register_queue("capped", concurrency=args.concurrency, polling_interval_sec=args.queue_polling)
    try:
        for i, wid in enumerate(ids):
            assert DBOS.retrieve_workflow(wid).get_result() == i + 2
        t_end = time.perf_counter()
    finally:
        DBOS.destroy(destroy_registry=True)
    import psycopg

    with psycopg.connect(common.conninfo(DBNAME), autocommit=True) as conn:
        row = conn.execute(
            "SELECT (max(updated_at) - min(started_at_epoch_ms)) / 1000.0, count(*) FROM dbos.workflow_status "
            "WHERE queue_name = 'capped'"
        ).fetchone()
    span = float(row[0])
    result["drain"] = {
        "n": args.drain,
        "concurrency": args.concurrency,
        "enqueue_seconds": enqueue,
        "enqueue_per_s": args.drain / enqueue,
        "drain_seconds_client": t_end - t1,
        "drain_seconds_db": span,
        "drained_per_s": args.drain / span,
        "rows": int(row[1]),
    }
    common.drop_database(DBNAME)
    common.write_result(args.out, result)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    os.environ.setdefault("DBOS__VMID", "queue-bench")
    main()
