"""Visibility benchmark (issue 19): ``weft.list_workflows`` with one search attribute filter over N
runs (default 1,000,000) on PostgreSQL; p50 / p99 per query shape, and the plan of each.

    python -m benchmarks.visibility [--runs 1000000] [--repeats 200] [--customers 1000]

Drops and re-creates its own database (``weft_bench_visibility``, see benchmarks/settings.py for the
connection variables), migrates it, and bulk-inserts the fixture with SQL (``generate_series``): N
``bench.visibility`` runs (80 % completed, 20 % running; created_at one millisecond apart), each with
two attributes, ``customer`` = ``c<i mod customers>`` (str: 1,000 runs per customer by default) and
``amount`` = ``(i mod 10000) / 10`` (float), then VACUUM ANALYZE (as autovacuum would). Each shape
is timed ``--repeats`` times through the public API (a random customer / threshold each time), in
this process, after a warm-up.
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
os.environ.setdefault("WEFT_BENCH_PG_NAME", "weft_bench_visibility")


def _fixture(runs: int, customers: int) -> float:
    from django.db import connection

    from weft_django.models import Workflow, WorkflowAttribute

    wf, attr = Workflow._meta.db_table, WorkflowAttribute._meta.db_table
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {wf} (id, run_id, workflow_type, version, status, input, parent_close_policy, depth, "
            "current_step, stuck_attempts, created_at, updated_at, started_at, finished_at) "
            "SELECT 'v' || i, md5('v' || i)::uuid, 'bench.visibility', '1', "
            "CASE WHEN i %% 5 = 0 THEN 'running' ELSE 'completed' END, '{\"args\":[],\"kwargs\":{}}', 'terminate', 0, "
            "'', 0, t, t, t, CASE WHEN i %% 5 = 0 THEN NULL ELSE t + interval '1 second' END "
            "FROM (SELECT i, now() - (%s - i) * interval '1 millisecond' AS t FROM generate_series(1, %s) AS i) s",
            [runs, runs],
        )
        cursor.execute(
            f"INSERT INTO {attr} (workflow_id, name, position, kind, str_value) "
            "SELECT 'v' || i, 'customer', 0, 'str', 'c' || (i %% %s) FROM generate_series(1, %s) AS i",
            [customers, runs],
        )
        cursor.execute(
            f"INSERT INTO {attr} (workflow_id, name, position, kind, num_value) "
            "SELECT 'v' || i, 'amount', 0, 'float', (i %% 10000) / 10.0 FROM generate_series(1, %s) AS i",
            [runs],
        )
    # VACUUM as autovacuum would after such a load: the visibility map lets the attribute index scans
    # be index-only (without it every match is a heap fetch too).
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {wf}")
        cursor.execute(f"VACUUM ANALYZE {attr}")
    return time.perf_counter() - started


def _time(call: Any, repeats: int) -> tuple[list[float], Any]:
    for _ in range(5):  # warm-up: connection, plan caches, the pages of the index
        call()
    samples, last = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        last = call()
        samples.append((time.perf_counter() - began) * 1000)
    return samples, last


def _plan(kwargs: dict[str, Any]) -> str:
    from django.db import connection

    from weft_django.store import visibility as store
    from weft_django.visibility import selection

    queryset = store.select(selection(**kwargs), "default").order_by("-created_at", "-pk").values("id")[:51]
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--customers", type=int, default=1000)
    parser.add_argument("--plans", action="store_true", help="print EXPLAIN ANALYZE of each shape")
    options = parser.parse_args(argv)

    import django

    django.setup()
    from django.core.management import call_command

    from benchmarks.harness import percentile, recreate_database, server_facts

    recreate_database()
    call_command("migrate", verbosity=0)

    import weft_django as weft

    @weft.workflow(name="bench.visibility", attributes={"customer": str, "amount": float})
    def visibility_run(ctx: Any) -> Any:
        yield ctx.sleep(0)

    load = _fixture(options.runs, options.customers)
    rng = random.Random(19)
    page = weft.list_workflows(attributes={"customer": "c7"}, limit=50)
    shapes: list[tuple[str, Any]] = [
        (
            f"list, customer = cX (1 in {options.customers}), 50 per page",
            lambda: weft.list_workflows(attributes={"customer": f"c{rng.randrange(options.customers)}"}, limit=50),
        ),
        (
            "list, customer = cX, second page (cursor)",
            lambda: weft.list_workflows(attributes={"customer": "c7"}, limit=50, cursor=page.next_cursor),
        ),
        (
            "list, amount >= 999.0 (0.1 %), 50 per page",
            lambda: weft.list_workflows(attributes={"amount__gte": 999.0}, limit=50),
        ),
        (
            "list, amount in [500, 500.5) (0.05 %) + status=running",
            lambda: weft.list_workflows(attributes={"amount__gte": 500.0, "amount__lt": 500.5}, status="running"),
        ),
        (
            "count, customer = cX",
            lambda: weft.count_workflows(attributes={"customer": f"c{rng.randrange(options.customers)}"}),
        ),
        ("list, no filter, 50 per page (baseline)", lambda: weft.list_workflows(limit=50)),
        ("list, status=running, 50 per page (baseline)", lambda: weft.list_workflows(status="running", limit=50)),
    ]
    facts = server_facts()
    print(
        f"\nvisibility benchmark: {options.runs:,} runs, {2 * options.runs:,} attribute rows, PostgreSQL "
        f"{facts['server_version']}, fixture loaded in {load:.1f} s, {options.repeats} repeats per shape\n"
    )
    print(f"  {'shape':58}  {'p50 ms':>8}  {'p99 ms':>8}  {'mean ms':>8}  rows")
    for name, call in shapes:
        samples, last = _time(call, options.repeats)
        rows = last if isinstance(last, int) else len(last)
        print(
            f"  {name:58}  {percentile(samples, 0.5):8.2f}  {percentile(samples, 0.99):8.2f}  "
            f"{statistics.fmean(samples):8.2f}  {rows}"
        )
    if options.plans:
        for kwargs in ({"attributes": {"customer": "c7"}}, {"attributes": {"amount__gte": 999.0}}):
            print(f"\nEXPLAIN ANALYZE of list_workflows({kwargs}):\n{_plan(kwargs)}")


if __name__ == "__main__":
    main()
