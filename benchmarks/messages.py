"""Query and update round trips from a separate process (not a test).

    python -m benchmarks.messages [--calls 300] [--modes listen,poll] [--poll-interval 100ms]

Drops and re-creates the PostgreSQL database ``weft_bench_msgs`` (WEFT_BENCH_MSGS_DB), starts one
``weft_engine`` subprocess that owns one ``bench.messages`` workflow, and from this process times
``handle.query("count")`` and ``handle.update("add", 1)`` one after another (each call's full round
trip: request row, wake-up, the engine's answer, wake-up, read). Modes:

* ``listen``: LISTEN/NOTIFY on both sides (the PostgreSQL default);
* ``poll``: neither side listens (as on SQLite): the engine finds requests every POLL_INTERVAL and
  the caller re-reads with its back-off (50 ms doubling to 500 ms).

Prints p50 / p90 / p99 / max per mode and kind and writes ``benchmarks/results/<timestamp>-messages.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DB_NAME = os.environ.get("WEFT_BENCH_MSGS_DB", "weft_bench_msgs")
os.environ["WEFT_BENCH_PG_NAME"] = DB_NAME
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
WORKFLOW_ID = "bench-messages"


def register() -> None:
    """The benchmark's workflow, registered by the client and by the engine subprocess alike."""
    import weft_django as weft
    from weft_django.registry import registry

    if "bench.messages" in registry.latest:
        return

    @weft.workflow(name="bench.messages")
    def bench_messages(ctx: Any) -> Any:
        state = {"count": 0}
        ctx.expose(count=lambda: state["count"])

        def add(amount: int) -> int:
            state["count"] += amount
            return state["count"]

        ctx.on_update("add", add, validator=lambda v: None if isinstance(v, int) else "an int")
        yield ctx.wait_for_signal("stop")
        return state["count"]


def no_listening() -> None:
    """Polling mode: neither the engine nor this process LISTENs."""
    import threading

    from weft_django import waits
    from weft_django.engine import engine

    class Deaf(threading.Thread):
        def __init__(self, *args: Any) -> None:
            super().__init__(daemon=True)

    engine.Listener = Deaf  # type: ignore[assignment,misc]
    waits.listener_for = lambda alias: None  # type: ignore[assignment]


def engine_main(mode: str) -> None:
    import django

    django.setup()
    register()
    if mode == "poll":
        no_listening()
    from django.core.management import call_command

    call_command("weft_engine", "--engine-id", f"bench-messages-{mode}")


def recreate_database() -> None:
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    with psycopg.connect(dbname="postgres", user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{DB_NAME}"')


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_mode(mode: str, calls: int, poll_interval: str) -> dict[str, Any]:
    import weft_django as weft
    from weft_django import client
    from weft_django.models import WorkflowClaim
    from weft_django.testing import wait_for

    env = {**os.environ, "WEFT_BENCH_OVERRIDES": json.dumps({"POLL_INTERVAL": poll_interval})}
    weft.start("bench.messages", id=WORKFLOW_ID, on_conflict="use_existing")
    log = open(RESULTS / f"{stamp}-messages-{mode}-engine.log", "w")  # noqa: SIM115
    engine = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.messages", "--engine", mode], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    try:
        wait_for(
            lambda: WorkflowClaim.objects.filter(pk=WORKFLOW_ID, engine_id=f"bench-messages-{mode}").exists(),
            timeout=60,
            message="the engine to claim the workflow",
        )
        handle = weft.get_handle(WORKFLOW_ID)
        for _ in range(10):  # warm up: connections, the LISTEN thread
            handle.query("count", timeout="30s")
            handle.update("add", 0, timeout="30s")
        figures: dict[str, Any] = {}
        for kind in ("query", "update"):
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                if kind == "query":
                    handle.query("count", timeout="30s")
                else:
                    handle.update("add", 1, timeout="30s")
                times.append((time.perf_counter() - started) * 1000)
            figures[kind] = {
                "calls": calls,
                "p50_ms": round(percentile(times, 0.5), 2),
                "p90_ms": round(percentile(times, 0.9), 2),
                "p99_ms": round(percentile(times, 0.99), 2),
                "max_ms": round(max(times), 2),
                "mean_ms": round(statistics.fmean(times), 2),
            }
        return figures
    finally:
        engine.terminate()
        engine.wait(30)
        log.close()
        client.close_connections()


stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--modes", default="listen,poll")
    parser.add_argument("--poll-interval", default="100ms")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.engine:
        engine_main(options.engine)
        return
    import django

    django.setup()
    recreate_database()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    register()
    RESULTS.mkdir(exist_ok=True)
    results: dict[str, Any] = {
        "when": stamp,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "poll_interval": options.poll_interval,
        "modes": {},
    }
    for mode in options.modes.split(","):
        if mode == "poll":
            no_listening()
        results["modes"][mode] = run_mode(mode, options.calls, options.poll_interval)
    print(f"{'mode':8} {'kind':7} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for mode, kinds in results["modes"].items():
        for kind, f in kinds.items():
            print(f"{mode:8} {kind:7} {f['p50_ms']:8.1f} {f['p90_ms']:8.1f} {f['p99_ms']:8.1f} {f['max_ms']:8.1f}")
    print(f"load average {results['load_average']}, {results['cpus']} CPUs, POLL_INTERVAL {options.poll_interval}")
    (RESULTS / f"{stamp}-messages.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
