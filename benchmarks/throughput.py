"""The ``throughput`` and ``backlog`` scenarios of benchmarks/run.py: N ``bench.three_noop`` workflows
run by ONE ``weft_engine`` subprocess, started while the engine runs (throughput) or before it starts
(backlog), and the figures of that run (latency, engine CPU, transactions and row writes per step,
the engine's traced SQL). ``three_noop_run`` is also the run that fencing_cost.py repeats per
OWNERSHIP mode."""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    POLL_SECONDS,
    RESULTS,
    STALL_SECONDS,
    STATS_READ_TRANSACTIONS,
    EngineProcess,
    counter_delta,
    db_counters,
    percentile,
    pgss_reset,
    pgss_top,
    settle_stats,
)


def scenario_throughput(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    """The issue's scenario: the engine is up first, then one client starts N workflows as fast as it
    can (one weft.start() call each); timed from the first start to the last completion."""
    return three_noop_run("throughput", options, stamp, engine_first=True)


def scenario_backlog(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    """The engine's own capacity: N workflows are started while no engine runs, then ONE engine is
    started and drains them; timed from the first step it starts to the last completion."""
    return three_noop_run("backlog", options, stamp, engine_first=False)


def _start_all(n: int) -> float:
    from tqdm import tqdm

    import weft_django as weft
    from benchmarks.benchapp.workflows import three_noop

    began = time.monotonic()
    for i in tqdm(range(n), desc="start   ", unit="wf", leave=True):
        weft.start(three_noop, args=[i])
    return time.monotonic() - began


def three_noop_run(
    name: str,
    options: argparse.Namespace,
    stamp: str,
    *,
    engine_first: bool,
    weft: dict[str, Any] | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    from django.db import connection
    from tqdm import tqdm

    from benchmarks import sqltrace
    from weft_django.models import Workflow

    n = options.workflows
    steps = 3 * n
    weft = {**options.weft, **(weft or {})}
    label = label or name
    RESULTS.mkdir(exist_ok=True)
    trace_out = RESULTS / f"{stamp}-{label}-engine-sql.json" if options.trace_sql else None
    log = RESULTS / f"{stamp}-{label}-engine.log"
    profile = RESULTS / f"{stamp}-{label}-engine-pyspy.txt" if options.py_spy else None

    settle_stats()
    if options.pgss:
        pgss_reset()
    before = db_counters()
    sqltrace.reset()
    client: dict[str, dict[str, Any]] = {}

    engine: EngineProcess | None = None
    engine_boot_cpu: float | None = None  # known only when the engine is up before the work starts
    client_cpu0 = time.process_time()
    spy: subprocess.Popen[bytes] | None = None
    stalled = False
    done = 0
    try:
        if engine_first:
            engine = EngineProcess(
                "bench-1", options.engine_concurrency, options.engine_verbosity, trace_out, log, weft
            )
            engine.wait_ready()
            engine_boot_cpu = engine.cpu_seconds()
            client["boot"] = sqltrace.snapshot()  # the readiness polling, not part of the starts
            sqltrace.reset()
            spy = _py_spy(engine, profile)
            clock0 = time.monotonic()
            start_seconds = _start_all(n)
        else:
            start_seconds = _start_all(n)
            if options.analyze:
                with connection.cursor() as cursor:
                    cursor.execute("ANALYZE")
            client["starts"] = sqltrace.snapshot()
            sqltrace.reset()
            clock0 = time.monotonic()
            engine = EngineProcess(
                "bench-1", options.engine_concurrency, options.engine_verbosity, trace_out, log, weft
            )
            spy = _py_spy(engine, profile)
        if engine_first:
            client["starts"] = sqltrace.snapshot()
            sqltrace.reset()

        last_progress = time.monotonic()
        with tqdm(total=n, desc="complete", unit="wf", leave=True) as bar:
            while True:
                count = Workflow.objects.filter(status="completed").count()
                if count != done:
                    bar.update(count - done)
                    done = count
                    last_progress = time.monotonic()
                if done >= n:
                    break
                if not engine.alive():
                    raise RuntimeError(f"engine exited with {engine.process.returncode}:\n{engine.tail()}")
                if time.monotonic() - last_progress > STALL_SECONDS:
                    stalled = True
                    break
                time.sleep(POLL_SECONDS)
        client_seconds = time.monotonic() - clock0
        engine_cpu = engine.cpu_seconds()
        client["poll"] = sqltrace.snapshot()
        sqltrace.reset()
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its report on SIGINT
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
        code = engine.stop() if engine is not None else None
    if stalled:
        assert engine is not None
        raise RuntimeError(
            f"no progress for {STALL_SECONDS}s at {done}/{n} completed; engine log {log}:\n{engine.tail()}"
        )

    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT EXTRACT(EPOCH FROM w.finished_at - w.created_at),
                      EXTRACT(EPOCH FROM s.first_step - w.created_at)
               FROM weft_django_workflow w
               JOIN (SELECT workflow_id, min(started_at) AS first_step FROM weft_django_step GROUP BY workflow_id) s
                 ON s.workflow_id = w.id
               WHERE w.status = 'completed'"""
        )
        rows = cursor.fetchall()
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(created_at)), "
            "EXTRACT(EPOCH FROM max(finished_at) - (SELECT min(started_at) FROM weft_django_step)) "
            "FROM weft_django_workflow"
        )
        span_from_start, span_from_first_step = (float(v) for v in cursor.fetchone())
        cursor.execute("SELECT status, count(*) FROM weft_django_workflow GROUP BY status")
        statuses = dict(cursor.fetchall())
        cursor.execute("SELECT count(*) FROM weft_django_step WHERE status = 'completed'")
        committed_steps = cursor.fetchone()[0]
    client["results"] = sqltrace.snapshot()
    client_cpu = time.process_time() - client_cpu0
    latencies = [float(r[0]) for r in rows]
    first_step = [float(r[1]) for r in rows]

    settle_stats()
    after = db_counters()
    delta = counter_delta(before, after)
    client_tx = sum(c["transactions"] for c in client.values())
    engine_tx = delta["xact_commit"] - client_tx - STATS_READ_TRANSACTIONS
    writes = delta["tup_inserted"] + delta["tup_updated"] + delta["tup_deleted"]
    # throughput: from the first start (engine already up) or from the engine's first step (backlog)
    span = span_from_start if engine_first else span_from_first_step

    result: dict[str, Any] = {
        "scenario": name,
        "timed_from": "first start" if engine_first else "engine's first step",
        "workflows": n,
        "steps": steps,
        "committed_steps": committed_steps,
        "statuses": statuses,
        "engine_concurrency": options.engine_concurrency,
        "weft_overrides": weft,
        "engine_command": " ".join(engine.command),
        "engine_exit_code": code,
        "engine_log": str(log),
        "engine_profile": str(profile) if profile else None,
        "sql_traced": bool(options.trace_sql),
        "analyzed_before_engine": bool(options.analyze) and not engine_first,
        "start_seconds": start_seconds,
        "starts_per_s": n / start_seconds,
        "starts_with_engine_running": engine_first,
        "total_seconds_client": client_seconds,
        "total_seconds_db": span,
        "span_first_start_to_last_completion": span_from_start,
        "span_first_step_to_last_completion": span_from_first_step,
        "workflows_per_s": n / span,
        "steps_per_s": steps / span,
        "latency_s": {
            "p50": percentile(latencies, 0.50),
            "p90": percentile(latencies, 0.90),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies, default=float("nan")),
            "mean": statistics.fmean(latencies) if latencies else float("nan"),
        },
        "first_step_delay_s": {
            "p50": percentile(first_step, 0.50),
            "p99": percentile(first_step, 0.99),
            "max": max(first_step, default=float("nan")),
        },
        "engine_cpu_seconds": engine_cpu,
        "engine_boot_cpu_seconds": engine_boot_cpu,
        "engine_cpu_ms_per_step": (
            (engine_cpu - (engine_boot_cpu or 0.0)) * 1000 / steps if engine_cpu is not None else None
        ),
        "client_cpu_seconds": client_cpu,
        "db": delta,
        "client": {
            "start_statements_per_start": client["starts"]["statements"] / n,
            "start_transactions_per_start": client["starts"]["transactions"] / n,
            "start_statement_shapes": client["starts"]["shapes"],
            "poll_transactions": client["poll"]["transactions"],
            "transactions_total": client_tx,
        },
        "engine_transactions": engine_tx,
        "engine_transactions_per_step": engine_tx / steps,
        "row_writes_per_step": writes / steps,
        "row_writes_per_step_engine": (writes - _start_row_writes(delta, n)) / steps,
    }
    if options.pgss:
        result["pg_stat_statements_top"] = pgss_top()
    if trace_out is not None and trace_out.exists():
        trace = json.loads(trace_out.read_text())
        result["engine_sql"] = {
            "statements": trace["statements"],
            "transactions": trace["transactions"],
            "write_transactions": trace["write_transactions"],
            "rollbacks": trace["rollbacks"],
            "statements_per_step": trace["statements"] / steps,
            "transactions_per_step": trace["transactions"] / steps,
            "write_transactions_per_step": trace["write_transactions"] / steps,
            "by_thread": trace["by_thread"],
            "top_shapes": trace["shapes"][:25],
            # statements that read or write claim rows (acquire, renew, the fence's lock, release, ...)
            "claim_statements": sum(shape["calls"] for shape in trace["shapes"] if "workflowclaim" in shape["sql"]),
        }
    return result


def _py_spy(engine: EngineProcess, out: Path | None) -> subprocess.Popen[bytes] | None:
    """Sample the engine with py-spy (``--py-spy``) until the scenario ends: collapsed stacks of every
    thread, idle samples included (wall-clock time: where the main loop waits, not only its CPU)."""
    if out is None:
        return None
    binary = Path(sys.executable).with_name("py-spy")
    if not binary.exists():
        raise RuntimeError("--py-spy needs py-spy in the venv: pip install py-spy")
    return subprocess.Popen(
        [
            str(binary),
            "record",
            "--pid",
            str(engine.process.pid),
            "--format",
            "raw",
            "--rate",
            "200",
            "--threads",
            "--idle",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _start_row_writes(delta: dict[str, Any], n: int) -> int:
    """Rows the client's starts inserted: the workflow rows and their claim rows (only starts insert them)."""
    tables = delta["tables"]
    return sum(tables.get(t, {}).get("ins", 0) for t in ("weft_django_workflow", "weft_django_workflowclaim"))
