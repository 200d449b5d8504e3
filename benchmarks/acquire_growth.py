"""The acquire-and-load after the tables have grown under a connection that prepared it while they
were small (docs/benchmarks.md, issue 16 session 10, "The plan trap"); prints one line.

    PYTHONPATH=$PWD python -m benchmarks.acquire_growth [--first 20] [--runs 10000] [--batches 20]

Database ``<WEFT_BENCH_PG_NAME or weft_acquire_growth>`` (dropped and re-created). Starts ``--first``
runs, takes them with ``acquire_and_load`` (this connection prepares its statements, or plans them,
on small tables), starts ``--runs`` more and writes three steps for each (no ANALYZE), then times
``--batches`` acquires of 50.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--first", type=int, default=20)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=20)
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    name = os.environ.setdefault("WEFT_BENCH_PG_NAME", "weft_acquire_growth")
    from benchmarks.peer_apps import common

    common.recreate_database(name)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    import weft_django as weft
    from weft_django.store.claims import taking

    call_command("migrate", verbosity=0)
    ttl = timedelta(seconds=60)
    weft.start_many([weft.StartRequest("bench.three_noop", args=[i]) for i in range(options.first)])
    taking.acquire_and_load("growth-1", limit=50, ttl=ttl, using="default")
    weft.start_many([weft.StartRequest("bench.three_noop", args=[i]) for i in range(options.runs)])
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO weft_django_step (workflow_id, run_id, seq, kind, name, status, attempts, epoch, "
            "started_at) SELECT w.id, w.run_id, k, 'activity', 'x', 'completed', 1, 1, now() "
            "FROM weft_django_workflow w, generate_series(0, 2) k"
        )
    times = []
    for _ in range(options.batches):
        t0 = time.perf_counter()
        claimed, loaded = taking.acquire_and_load("growth-1", limit=50, ttl=ttl, using="default")
        times.append(time.perf_counter() - t0)
        assert len(claimed) == 50 and loaded is not None and len(loaded.runs) == 50
    print(
        f"acquire_and_load of 50 after growing from {options.first} to {options.first + options.runs:,} runs: "
        f"p50 {statistics.median(times) * 1000:.2f} ms, max {max(times) * 1000:.2f} ms"
    )


if __name__ == "__main__":
    main()
