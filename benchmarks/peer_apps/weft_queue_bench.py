"""weft_django queue driver for benchmarks/queues.py (a subprocess; writes one JSON result).

    python -m benchmarks.peer_apps.weft_queue_bench --out FILE [--workflows 2000] [--drain 10000]
                                                    [--concurrency 10]

Database ``weft_peer_weft`` (dropped, re-created, migrated). WEFT["QUEUES"] = {"free": {}, "capped":
{"concurrency": C}}. Workload ``bench.three_noop`` (three no-op activities).

(overhead) ONE engine (``--concurrency 10`` activity threads) is running; one client starts N runs
    sequentially, then a 20 ms poll waits for N completed: without a queue, then in queue "free" (no
    limits: the cost of admission alone).
(drain) no engine running: N runs are started in queue "capped" (concurrency C), then ONE engine is
    started; timed on the database clock from the first admission to the last finish, and from the
    engine's registration to the last finish on the client clock.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.peer_apps import common

ROOT = Path(__file__).resolve().parents[2]
DBNAME = common.DATABASES["weft"]
os.environ["WEFT_BENCH_PG_NAME"] = DBNAME
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"


def _completed(ids_from: Any) -> int:
    from weft_django.models import Workflow

    return Workflow.objects.filter(
        status="completed", workflow_type="bench.three_noop", created_at__gte=ids_from
    ).count()


def _db_now() -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def overhead(n: int, queue: str | None) -> dict[str, Any]:
    import weft_django as weft
    from benchmarks.benchapp.workflows import three_noop

    since = _db_now()
    t0 = time.perf_counter()
    for i in range(n):
        weft.start(three_noop, args=[i], queue=queue)
    t_started = time.perf_counter()
    common.wait_until(lambda: _completed(since) >= n, 600, what=f"{n} completed (queue={queue})")
    t_end = time.perf_counter()
    return common.throughput_summary(n, t_started - t0, t_end - t0)


def drain(n: int, concurrency: int, log: Path) -> dict[str, Any]:
    from django.db import connection

    import weft_django as weft
    from benchmarks.benchapp.workflows import three_noop
    from benchmarks.peer_apps.weft_bench import Engine

    since = _db_now()
    t0 = time.perf_counter()
    for i in range(n):
        weft.start(three_noop, args=[i], queue="capped")
    enqueue = time.perf_counter() - t0
    engine = Engine("queue-drain", 10, log)
    try:
        engine.wait_ready()
        t1 = time.perf_counter()
        common.wait_until(lambda: _completed(since) >= n, 1200, interval=0.1, what=f"{n} drained")
        t_end = time.perf_counter()
        cpu = engine.cpu()
    finally:
        engine.stop()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(admitted_at)) FROM weft_django_workflow "
            "WHERE queue = 'capped' AND created_at >= %s",
            [since],
        )
        db_span = float(cursor.fetchone()[0])
        cursor.execute(
            "SELECT max(c) FROM (SELECT (SELECT count(*) FROM weft_django_workflow o WHERE o.queue = 'capped' "
            "AND o.admitted_at <= w.admitted_at AND o.finished_at > w.admitted_at) AS c "
            "FROM weft_django_workflow w WHERE w.queue = 'capped' AND w.created_at >= %s) s",
            [since],
        )
        most = int(cursor.fetchone()[0])
    return {
        "n": n,
        "concurrency": concurrency,
        "enqueue_seconds": enqueue,
        "enqueue_per_s": n / enqueue,
        "drain_seconds_client": t_end - t1,
        "drain_seconds_db": db_span,
        "drained_per_s": n / db_span,
        "engine_cpu_seconds": cpu,
        "most_admitted_at_once": most,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--drain", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    queues = {"free": {}, "capped": {"concurrency": args.concurrency}}
    os.environ["WEFT_BENCH_OVERRIDES"] = json.dumps({"QUEUES": queues, "POLL_INTERVAL": "1s"})
    import django

    common.recreate_database(DBNAME)
    django.setup()
    from django.core.management import call_command

    from benchmarks.peer_apps.weft_bench import Engine

    call_command("migrate", verbosity=0)
    logs = ROOT / "benchmarks" / "results"
    logs.mkdir(exist_ok=True)
    result: dict[str, Any] = {"system": "weft_django", "database": DBNAME, "queues": queues}
    engine = Engine("queue-overhead", 10, logs / "weft-queue-overhead-engine.log")
    try:
        engine.wait_ready()
        overhead(20, None)  # warm-up
        overhead(20, "free")
        result["no_queue"] = overhead(args.workflows, None)
        result["queue_no_limits"] = overhead(args.workflows, "free")
    finally:
        engine.stop()
    result["drain"] = drain(args.drain, args.concurrency, logs / "weft-queue-drain-engine.log")
    common.drop_database(DBNAME)
    common.write_result(args.out, result)


if __name__ == "__main__":
    main()
