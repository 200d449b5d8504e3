"""weft_django driver for benchmarks/peers.py (run as a subprocess; writes one JSON result).

    python -m benchmarks.peer_apps.weft_bench --out FILE [--workflows 1000] [--latency 200] [--signals 200]
                                              [--trace-workflows 1000] [--engine-concurrency 8]

Database ``weft_peer_weft`` (dropped, re-created, migrated). ONE engine subprocess, exactly as
benchmarks/run.py starts it: ``python -m django weft_engine --engine-id peer-1 --concurrency 8`` with
DJANGO_SETTINGS_MODULE=benchmarks.settings and every WEFT setting at its shipped default (``--poll-interval``
overrides POLL_INTERVAL, the fallback behind LISTEN: the peers run with their defaults too).
Workloads: ``bench.three_noop`` and ``bench.parked`` (benchmarks/benchapp/workflows.py).

(a) throughput: the engine is registered; one client calls ``weft.start(three_noop)`` N times,
    sequentially; timed (client clock) from the first start until a 20 ms poll sees N completed.
(b) latency: one at a time, ``weft.start(...).result()``; per-workflow client latency.
(c) signal: M ``bench.parked`` workflows are started and parked (claimed, waiting for "go"); then one
    at a time ``handle.signal("go", i)`` and ``handle.result()``; timed from before signal() to the
    return of result().
Then statements: a second engine under benchmarks/sqltrace.py runs (a) again (counted in-process by
statement shape); the untraced (a) gives pg_stat_database commits and row writes per step.
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

from benchmarks.peer_apps import common

ROOT = Path(__file__).resolve().parents[2]
DBNAME = common.DATABASES["weft"]
os.environ["WEFT_BENCH_PG_NAME"] = DBNAME
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"


class Engine:
    def __init__(
        self,
        engine_id: str,
        concurrency: int,
        log: Path,
        trace_out: Path | None = None,
        processes: int = 1,
        weft: dict[str, Any] | None = None,
    ) -> None:
        """``weft``: WEFT settings for this engine only (merged over WEFT_BENCH_OVERRIDES)."""
        command = [sys.executable, "-m"]
        command += ["benchmarks.sqltrace", "--out", str(trace_out), "--"] if trace_out else ["django"]
        command += ["weft_engine", "--engine-id", engine_id, "--concurrency", str(concurrency), "-v", "1"]
        if processes > 1:  # one command, N engines (ids <engine_id>-1 ... -N)
            command += ["--processes", str(processes)]
        self.engine_id = engine_id
        self.ids = [engine_id] if processes == 1 else [f"{engine_id}-{i}" for i in range(1, processes + 1)]
        self.command = command
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ)
        if weft:
            env["WEFT_BENCH_OVERRIDES"] = json.dumps({**json.loads(env.get("WEFT_BENCH_OVERRIDES") or "{}"), **weft})
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        from weft_django.models import Engine as EngineRow

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"engine exited with {self.process.returncode}: see {self.log_path}")
            if EngineRow.objects.filter(id__in=self.ids, stopped_at__isnull=True).count() == len(self.ids):
                time.sleep(0.3)  # the LISTEN connection comes up right after registration
                return
            time.sleep(0.05)
        raise RuntimeError(f"engine did not register within {timeout}s: see {self.log_path}")

    def cpu(self) -> float | None:
        """CPU seconds of the command and, with --processes, of its engine processes."""
        from weft_django.models import Engine as EngineRow

        pids = [self.process.pid]
        if len(self.ids) > 1:
            pids += list(EngineRow.objects.filter(id__in=self.ids).values_list("pid", flat=True))
        seconds = [common.proc_cpu_seconds(pid) for pid in pids]
        return None if any(second is None for second in seconds) else sum(s for s in seconds if s is not None)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._log.close()


def _completed(workflow_type: str = "bench.three_noop") -> int:
    from weft_django.models import Workflow

    return Workflow.objects.filter(status="completed", workflow_type=workflow_type).count()


def throughput(n: int, progress: bool) -> dict[str, Any]:
    from django.db import connection
    from tqdm import tqdm

    import weft_django as weft
    from benchmarks.benchapp.workflows import three_noop

    base = _completed()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        db_t0 = cursor.fetchone()[0]
    t0 = time.perf_counter()
    for i in tqdm(range(n), desc="weft start", unit="wf", disable=not progress, leave=False):
        weft.start(three_noop, args=[i])
    t_started = time.perf_counter()
    deadline = time.monotonic() + 300
    with tqdm(total=n, desc="weft done ", unit="wf", disable=not progress, leave=False) as bar:
        done = 0
        while done < n:
            count = _completed() - base
            bar.update(count - done)
            done = count
            if done >= n:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"weft: {done}/{n} completed after 300 s")
            time.sleep(0.02)
    t_end = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(created_at)) FROM weft_django_workflow "
            "WHERE workflow_type = 'bench.three_noop' AND created_at >= %s",
            [db_t0],
        )
        db_span = float(cursor.fetchone()[0])
    out = common.throughput_summary(n, t_started - t0, t_end - t0)
    out["db_clock_seconds"] = db_span
    return out


def latency(n: int, progress: bool, workflow: str = "bench.three_noop") -> dict[str, Any]:
    from tqdm import tqdm

    import weft_django as weft

    times = []
    for i in tqdm(range(n), desc="weft one-at-a-time", unit="wf", disable=not progress, leave=False):
        t0 = time.perf_counter()
        weft.start(workflow, args=[i]).result(timeout=60)
        times.append(time.perf_counter() - t0)
    return common.latency_summary(times)


def signals(n: int, engine_id: str, progress: bool) -> dict[str, Any]:
    from tqdm import tqdm

    import weft_django as weft
    from benchmarks.benchapp.workflows import parked
    from weft_django.models import WorkflowClaim

    handles = [weft.start(parked, args=[i]) for i in range(n)]
    ids = [h.id for h in handles]
    common.wait_until(
        lambda: WorkflowClaim.objects.filter(workflow_id__in=ids, engine_id=engine_id).count() == n,
        60,
        what="all parked workflows claimed",
    )
    time.sleep(1.0)  # the engine commits the parked state
    times = []
    for i, h in enumerate(tqdm(handles, desc="weft signal", unit="wf", disable=not progress, leave=False)):
        t0 = time.perf_counter()
        h.signal("go", i)
        value = h.result(timeout=60)
        times.append(time.perf_counter() - t0)
        assert value == [i, i], value
    return common.latency_summary(times)


def settle() -> None:
    from django.db import connections

    connections.close_all()
    time.sleep(1.5)  # PostgreSQL 15 backends flush statistics at most once a second


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--latency", type=int, default=200)
    parser.add_argument("--signals", type=int, default=200)
    parser.add_argument("--trace-workflows", type=int, default=1000, help="0: no traced run")
    parser.add_argument(
        "--local-latency", type=int, default=0, help="(b_local): (b) with bench.three_local (local activities)"
    )
    parser.add_argument("--engine-concurrency", type=int, default=8)
    parser.add_argument("--poll-interval", default="1s", help="WEFT POLL_INTERVAL (default: the shipped 1s)")
    parser.add_argument("--stamp", default=time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    progress = not args.no_progress
    overrides = json.loads(os.environ.get("WEFT_BENCH_OVERRIDES") or "{}")
    os.environ["WEFT_BENCH_OVERRIDES"] = json.dumps({**overrides, "POLL_INTERVAL": args.poll_interval})

    import django

    common.recreate_database(DBNAME)
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    results_dir = ROOT / "benchmarks" / "results"
    results_dir.mkdir(exist_ok=True)
    result: dict[str, Any] = {
        "system": "weft_django",
        "database": DBNAME,
        "conn_max_age": settings.DATABASES["default"]["CONN_MAX_AGE"],
        "weft_settings": settings.WEFT,
    }

    engine = Engine("peer-1", args.engine_concurrency, results_dir / f"{args.stamp}-peers-weft-engine.log")
    result["engine_command"] = " ".join(engine.command)
    try:
        engine.wait_ready()
        settle()
        before = common.db_counters(DBNAME)
        cpu0 = engine.cpu()
        result["a"] = throughput(args.workflows, progress)
        cpu1 = engine.cpu()
        settle()
        after = common.db_counters(DBNAME)
        d = common.delta(before, after)
        steps = 3 * args.workflows
        result["a"]["engine_cpu_ms_per_step"] = (cpu1 - cpu0) * 1000 / steps if cpu0 is not None and cpu1 else None
        result["a"]["db"] = d
        result["a"]["db_commits_per_step"] = d["xact_commit"] / steps  # whole database: client + engine + LISTEN
        result["a"]["row_writes_per_step"] = (d["tup_inserted"] + d["tup_updated"] + d["tup_deleted"]) / steps
        parts = [
            ("b", args.latency, lambda: latency(args.latency, progress)),
            ("c", args.signals, lambda: signals(args.signals, engine.engine_id, progress)),
        ]
        if args.local_latency:
            parts.append(
                ("b_local", args.local_latency, lambda: latency(args.local_latency, progress, "bench.three_local"))
            )
        for part, count, run in parts:
            settle()
            before = common.db_counters(DBNAME)
            result[part] = run()
            settle()
            d = common.delta(before, common.db_counters(DBNAME))
            result[part]["db"] = d
            # connections opened per workflow (client waits + engine): each is a backend fork
            result[part]["sessions_per_workflow"] = d["sessions"] / count
            result[part]["db_commits_per_workflow"] = d["xact_commit"] / count
    finally:
        engine.stop()

    if args.trace_workflows:
        trace = results_dir / f"{args.stamp}-peers-weft-engine-sql.json"
        traced = Engine(
            "peer-trace", args.engine_concurrency, results_dir / f"{args.stamp}-peers-weft-traced.log", trace
        )
        try:
            traced.wait_ready()
            result["a_traced"] = throughput(args.trace_workflows, progress)
        finally:
            traced.stop()
        data = json.loads(trace.read_text())
        steps = 3 * args.trace_workflows
        if args.latency:  # the engine's statements per workflow when workflows come one at a time
            trace_b = results_dir / f"{args.stamp}-peers-weft-engine-sql-b.json"
            traced = Engine(
                "peer-trace-b", args.engine_concurrency, results_dir / f"{args.stamp}-peers-weft-traced-b.log", trace_b
            )
            n_b = min(args.latency, 100)
            try:
                traced.wait_ready()
                latency(n_b, progress)
            finally:
                traced.stop()
            data_b = json.loads(trace_b.read_text())
            result["engine_sql_b"] = {
                "workflows": n_b,
                "statements_per_workflow": data_b["statements"] / n_b,
                "transactions_per_workflow": data_b["transactions"] / n_b,
                "write_transactions_per_workflow": data_b["write_transactions"] / n_b,
                "top_shapes": data_b["shapes"][:20],
                "trace_file": str(trace_b),
            }
        result["engine_sql"] = {
            "workflows": args.trace_workflows,
            "statements": data["statements"],
            "transactions": data["transactions"],
            "write_transactions": data["write_transactions"],
            "statements_per_step": data["statements"] / steps,
            "transactions_per_step": data["transactions"] / steps,
            "write_transactions_per_step": data["write_transactions"] / steps,
            "top_shapes": data["shapes"][:15],
            "trace_file": str(trace),
        }
    from django.db import connections

    connections.close_all()
    common.drop_database(DBNAME)
    common.write_result(args.out, result)


if __name__ == "__main__":
    main()
