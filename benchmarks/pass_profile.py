"""Where one engine's passes go with a backlog: N three-step workflows started by one ``start_many``,
drained by an engine in THIS process, pass by pass; prints the passes, the workflows per fenced
commit, and the loop thread's time per statement shape.

    PYTHONPATH=$PWD /work/venv-bench/bin/python -m benchmarks.pass_profile [--workflows 10000] [--concurrency 8]
        [--steps regular|local] [--cprofile 40]

Database ``<WEFT_BENCH_PG_NAME or weft_pass_profile>`` (dropped and re-created). The engine is the
library's ``Engine`` ticked in a loop (no subprocess), so the figures include this process's own
polling (a COUNT every idle pass). Used for docs/benchmarks.md's "where the time goes"; the headline
throughput comes from ``benchmarks.bulk_starts`` (a real ``weft_engine`` subprocess).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import os
import pstats
import re
import threading
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workflows", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--steps", choices=("regular", "local"), default="regular", help="bench.three_noop or three_local"
    )
    parser.add_argument(
        "--cprofile", type=int, default=0, metavar="N", help="profile the drain; print the N top functions by own time"
    )
    parser.add_argument("--cprofile-out", metavar="FILE", help="with --cprofile: also write the stats to FILE")
    parser.add_argument(
        "--no-freeze", action="store_true", help="leave start-up objects to the collector (weft_engine freezes them)"
    )
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    os.environ.setdefault("WEFT_BENCH_PG_NAME", "weft_pass_profile")
    from benchmarks.harness import recreate_database

    recreate_database()  # the settings' database, dropped and created again
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    import weft_django as weft
    from benchmarks.benchapp.workflows import three_local, three_noop
    from weft_django.engine.engine import Engine
    from weft_django.management.commands.weft_engine import freeze_startup_objects
    from weft_django.models import Workflow

    call_command("migrate", verbosity=0)
    seconds: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()

    def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            if threading.current_thread() is threading.main_thread():
                shape = re.sub(r"\s+", " ", sql)[:70]
                seconds[shape] += time.perf_counter() - started
                calls[shape] += 1

    engine = Engine("pass-profile", concurrency=options.concurrency)
    batches: list[int] = []
    commit = engine._commit

    def counting_commit(batch: list[Any], now: Any, **options: Any) -> set[str]:
        batches.append(len(batch))
        return commit(batch, now, **options)

    engine._commit = counting_commit  # type: ignore[method-assign]
    if not options.no_freeze:
        freeze_startup_objects(engine.engine_id)  # as weft_engine does before its first pass
    collections_seen: list[int] = [0, 0, 0]
    collection_seconds: list[float] = [0.0, 0.0, 0.0]
    collection_started: list[float] = [0.0]

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collection_started[0] = time.perf_counter()
        elif not engine_started[0]:
            return
        else:
            collections_seen[info["generation"]] += 1
            collection_seconds[info["generation"]] += time.perf_counter() - collection_started[0]

    engine_started = [False]
    gc.callbacks.append(on_collection)
    engine.start()
    n = options.workflows
    workflow = three_local if options.steps == "local" else three_noop
    weft.start_many([weft.StartRequest(workflow, args=[i]) for i in range(n)])
    connection.execute_wrappers.append(timed)  # the engine's statements from here on (the loop runs here)
    profiler = cProfile.Profile() if options.cprofile else None
    if profiler is not None:
        profiler.enable()
    engine_started[0] = True
    started, passes, most = time.perf_counter(), 0, 0
    while True:
        busy = engine.tick()
        passes += 1
        most = max(most, len(engine.owned))
        if not busy:
            if Workflow.objects.filter(status="completed").count() >= n:
                break
            engine._wait(0.01)
    elapsed = time.perf_counter() - started
    if profiler is not None:
        profiler.disable()
    engine.shutdown()
    print(f"{n:,} workflows in {elapsed:.2f} s ({n / elapsed:,.0f} wf/s), concurrency {options.concurrency}")
    print(
        f"passes {passes:,}; fenced commits {len(batches):,}, workflows per commit: mean "
        f"{sum(batches) / max(1, len(batches)):.1f}, max {max(batches, default=0)}; most held at once {most:,}; "
        f"commits beside a claim ahead (WEFT['CLAIM_AHEAD']; their statements are not timed below) "
        f"{engine.commits.overlapped:,}"
    )
    print(f"the loop thread's statements: {sum(seconds.values()):.2f} s of {elapsed:.2f} s")
    print(
        "the cyclic garbage collector during the drain (all threads): "
        + ", ".join(f"generation {g}: {collections_seen[g]} in {collection_seconds[g]:.3f} s" for g in range(3))
    )
    for shape, spent in seconds.most_common(12):
        print(f"{spent:7.2f} s {calls[shape]:7,}  {shape}")
    if profiler is not None:
        print("\nthe drain under cProfile (its overhead included; the ranking is what matters):")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(options.cprofile)
        if options.cprofile_out:
            profiler.dump_stats(options.cprofile_out)


if __name__ == "__main__":
    main()
