"""Run the weft_django benchmarks and print a results table.

    python -m benchmarks.run [--workflows 1000] [--scenarios throughput[,backlog,takeover,fencing-cost]]
                             [--engine-concurrency 8] [--conn-max-age SECONDS|none] [--analyze] [--trace-sql]
                             [--py-spy] [--engine-verbosity 1] [--weft KEY=VALUE ...]
                             [--takeover-workflows 200] [--takeover-timings 3s/1s,30s/5s]
                             [--takeover-cases kill,term,kill-go] [--fencing-base throughput|backlog]
                             [--fencing-rounds 2]

Each run drops and re-creates the PostgreSQL database ``weft_bench`` (see benchmarks/settings.py),
migrates it, and runs the scenarios against real ``weft_engine`` subprocesses (ONE, except takeover):

* ``throughput`` (the default): the engine is up, then one client starts N ``bench.three_noop``
  workflows, one ``weft.start()`` call each, as fast as it can; timed from the first start to the
  last completion.
* ``backlog``: the N workflows are started while no engine runs, then the engine drains them; timed
  from its first step to the last completion (the engine's own capacity, without a competing client).
* ``takeover``: engine A holds the claims of N parked ``bench.parked`` workflows, engine B runs beside
  it; A is SIGKILLed (``kill``), SIGTERMed (``term``), or SIGKILLed with "go" sent to every workflow
  right after (``kill-go``); timed until B holds every claim (or every workflow completed), per
  claim TTL/renew pair.
* ``fencing-cost``: throughput (or backlog) with OWNERSHIP "workflow-lease" and "none", alternately.
* ``parked`` and ``timers`` (issue 9 (f), (g)): 10,000 parked workflows held by one engine, and an
  engine's tick beside 0 / 10,000 / 100,000 sleeping timers; see benchmarks/scale.py.

The table is printed and written as JSON to ``benchmarks/results/<timestamp>.json`` (gitignored), next
to the engine's log (and, with the flags, its SQL trace and py-spy stacks). See docs/benchmarks.md.
Not collected by pytest (testpaths = tests).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import scale
from benchmarks.harness import (
    POLL_SECONDS,
    RESULTS,
    ROOT,
    STALL_SECONDS,
    STATS_READ_TRANSACTIONS,
    EngineProcess,
    _fmt,
    counter_delta,
    db_counters,
    percentile,
    pgss_reset,
    pgss_top,
    recreate_database,
    server_facts,
    settle_stats,
    table,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")


def scenario_throughput(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    """The issue's scenario: the engine is up first, then one client starts N workflows as fast as it
    can (one weft.start() call each); timed from the first start to the last completion."""
    return _three_noop_run("throughput", options, stamp, engine_first=True)


def scenario_backlog(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    """The engine's own capacity: N workflows are started while no engine runs, then ONE engine is
    started and drains them; timed from the first step it starts to the last completion."""
    return _three_noop_run("backlog", options, stamp, engine_first=False)


def _start_all(n: int) -> float:
    from tqdm import tqdm

    import weft_django as weft
    from benchmarks.benchapp.workflows import three_noop

    began = time.monotonic()
    for i in tqdm(range(n), desc="start   ", unit="wf", leave=True):
        weft.start(three_noop, args=[i])
    return time.monotonic() - began


def _three_noop_run(
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


# ------------------------------------------------------------------------------------------ takeover

TAKEOVER_POLL_SECONDS = 0.02
TAKEOVER_CASES = {
    "kill": "SIGKILL engine A; timed until engine B holds all N claims",
    "term": "SIGTERM engine A (graceful: it releases its claims); timed until engine B holds all N claims",
    "kill-go": 'SIGKILL engine A, then "go" to all N at once; timed until all N completed',
}


def _seconds(value: Any) -> float:
    from weft_django.durations import to_ms

    return to_ms(value) / 1000


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "min": min(values, default=float("nan")),
        "p50": percentile(values, 0.50),
        "p99": percentile(values, 0.99),
        "max": max(values, default=float("nan")),
    }


def _passes(offsets: list[float], gap: float = 0.05) -> list[list[float]]:
    """Group event times (seconds after the kill) into passes: [[first offset, count], ...]."""
    groups: list[list[float]] = []
    for t in sorted(offsets):
        if groups and t - groups[-1][2] <= gap:
            groups[-1][1] += 1
            groups[-1][2] = t
        else:
            groups.append([t, 1, t])
    return [[first, count] for first, count, _ in groups]


def _took_over_from_log(log: Path, since: dt.datetime) -> list[float]:
    """Seconds after ``since`` of the engine's "took over workflow=..." warnings (the log's asctime is
    local time, like ``since``)."""
    import re

    pattern = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING .* took over workflow=")
    offsets = []
    for line in log.read_text().splitlines():
        match = pattern.match(line)
        if match:
            stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            offsets.append((stamp - since).total_seconds())
    return offsets


def scenario_takeover(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    """Engine A holds the claims of N parked workflows (``bench.parked`` waits for signal "go"); engine
    B runs beside it; then A is killed (SIGKILL) or stopped (SIGTERM) and the time until B holds every
    claim (or, with "go" sent right after the kill, until every workflow completed) is measured, once
    per claim timing (TTL/renew) and case, each on a flushed database."""
    from django.core.management import call_command

    cases = []
    for ttl, renew in options.takeover_timings:
        for case in options.takeover_cases:
            call_command("flush", interactive=False, verbosity=0)
            cases.append(_takeover_case(case, ttl, renew, options, stamp))
    return {
        "scenario": "takeover",
        "workflows": options.takeover_workflows,
        "engine_concurrency": options.engine_concurrency,
        "poll_seconds": TAKEOVER_POLL_SECONDS,
        "cases": cases,
    }


def _claim_counts() -> tuple[dict[str | None, int], int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT engine_id, count(*) FROM weft_django_workflowclaim GROUP BY engine_id")
        held = dict(cursor.fetchall())
        cursor.execute("SELECT count(*) FROM weft_django_workflow WHERE status = 'completed'")
        completed = cursor.fetchone()[0]
    return held, completed


def _db_clock() -> dt.datetime:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _takeover_case(case: str, ttl: str, renew: str, options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    from django.conf import settings
    from django.db import connection
    from tqdm import tqdm

    import weft_django as weft
    from benchmarks.benchapp.workflows import parked
    from weft_django.conf import DEFAULTS

    n = options.takeover_workflows
    overrides = {**options.weft, "WORKFLOW_CLAIM_TTL": ttl, "WORKFLOW_CLAIM_RENEW_INTERVAL": renew}
    effective = {**DEFAULTS, **settings.WEFT, **overrides}
    ttl_s, renew_s = _seconds(ttl), _seconds(renew)
    poll_s = _seconds(effective["POLL_INTERVAL"])
    batch = int(effective["CLAIM_BATCH_SIZE"])
    passes_needed = -(-n // batch)
    tag = f"takeover-{case}-{ttl}-{renew}"
    print(f"\n{tag}: {TAKEOVER_CASES[case]}", flush=True)

    RESULTS.mkdir(exist_ok=True)
    verbosity, concurrency = options.engine_verbosity, options.engine_concurrency
    a = EngineProcess("bench-a", concurrency, verbosity, None, RESULTS / f"{stamp}-{tag}-engine-a.log", overrides)
    b: EngineProcess | None = None
    result: dict[str, Any] = {
        "case": case,
        "description": TAKEOVER_CASES[case],
        "workflows": n,
        "workflow_claim_ttl": ttl,
        "workflow_claim_renew_interval": renew,
        "poll_interval_s": poll_s,
        "claim_batch_size": batch,
        "weft_overrides": overrides,
        "engine_logs": [str(a.log_path)],
    }
    try:
        a.wait_ready()
        ids = [weft.start(parked, args=[i]).id for i in tqdm(range(n), desc="start   ", unit="wf", leave=True)]
        deadline = time.monotonic() + 60
        while _claim_counts()[0].get(a.engine_id, 0) < n:
            if not a.alive():
                raise RuntimeError(f"engine A exited with {a.process.returncode}:\n{a.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine A did not claim all {n} workflows within 60 s:\n{a.tail()}")
            time.sleep(POLL_SECONDS)
        time.sleep(0.5)  # A commits the parked state
        b = EngineProcess("bench-b", concurrency, verbosity, None, RESULTS / f"{stamp}-{tag}-engine-b.log", overrides)
        result["engine_logs"].append(str(b.log_path))
        b.wait_ready()
        held, _ = _claim_counts()
        if held.get(a.engine_id, 0) != n:
            raise RuntimeError(f"before the kill, A holds {held.get(a.engine_id, 0)} of {n} claims: {held}")

        with connection.cursor() as cursor:  # A's renewal time before the kill (SIGTERM: it releases them)
            cursor.execute(
                "SELECT min(expires_at), max(expires_at) FROM weft_django_workflowclaim WHERE engine_id = %s",
                [a.engine_id],
            )
            expiry_before = cursor.fetchone()
        sig = signal.SIGTERM if case == "term" else signal.SIGKILL
        wall0 = dt.datetime.now()
        clock0 = time.monotonic()
        a.process.send_signal(sig)
        kill_db = _db_clock()
        a_exited = None
        if sig == signal.SIGKILL:
            a.process.wait(10)
            a_exited = time.monotonic() - clock0
            time.sleep(0.05)
            with connection.cursor() as cursor:  # final: a renewal in flight at the kill may have landed
                cursor.execute(
                    "SELECT min(expires_at), max(expires_at) FROM weft_django_workflowclaim WHERE engine_id = %s",
                    [a.engine_id],
                )
                expiry = cursor.fetchone()
        else:
            expiry = expiry_before
        signals_s = None
        if case == "kill-go":
            t = time.monotonic()
            for wid in ids:
                weft.signal(wid, "go", "now")
            signals_s = time.monotonic() - t

        # 20 ms polls: when A's claims are gone, when B holds them all, when all completed
        timeline: dict[str, float | None] = {"a_exited": a_exited, "a_holds_none": None, "b_first": None, "b_all": None}
        timeline["all_completed"] = None
        limit = ttl_s + 3 * renew_s + passes_needed * renew_s + 60
        done = False
        while not done:
            held, completed = _claim_counts()
            now = time.monotonic() - clock0
            if timeline["a_exited"] is None and not a.alive():
                timeline["a_exited"] = now
            if timeline["a_holds_none"] is None and held.get(a.engine_id, 0) == 0:
                timeline["a_holds_none"] = now
            b_held = held.get(b.engine_id, 0)
            if timeline["b_first"] is None and (b_held or completed):
                timeline["b_first"] = now
            if timeline["b_all"] is None and b_held == n:
                timeline["b_all"] = now
            if timeline["all_completed"] is None and completed == n:
                timeline["all_completed"] = now
            done = timeline["all_completed"] is not None if case == "kill-go" else timeline["b_all"] is not None
            if not done:
                if not b.alive():
                    raise RuntimeError(f"engine B exited with {b.process.returncode}:\n{b.tail()}")
                if now > limit:
                    raise RuntimeError(
                        f"{tag}: not done after {limit:.0f} s (claims {held}, {completed} completed); "
                        f"engine B log {b.log_path}:\n{b.tail()}"
                    )
                time.sleep(TAKEOVER_POLL_SECONDS)
        if a.alive():
            a.process.wait(30)
        timeline["a_exited"] = timeline["a_exited"] if timeline["a_exited"] is not None else time.monotonic() - clock0
        result["a_exit_code"] = a.process.returncode

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM claimed_at - %s) FROM weft_django_workflowclaim WHERE engine_id = %s",
                [kill_db, b.engine_id],
            )
            claimed = [float(r[0]) for r in cursor.fetchall()]
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM finished_at - %s) FROM weft_django_workflow WHERE status = 'completed'",
                [kill_db],
            )
            finished = [float(r[0]) for r in cursor.fetchall()]
            cursor.execute("SELECT status, count(*) FROM weft_django_workflow GROUP BY status")
            statuses = dict(cursor.fetchall())
    finally:
        for engine in (b, a):
            if engine is not None:
                engine.stop()
    took_over_log = _took_over_from_log(b.log_path, wall0)
    if case == "kill-go":
        takeover_offsets = took_over_log  # B released the claims at completion: claimed_at is gone
        source = "engine B's 'took over' log lines"
    else:
        takeover_offsets = claimed
        source = "claimed_at - kill, database clock"

    def after_kill(value: dt.datetime | None) -> float | None:
        return (value - kill_db).total_seconds() if value is not None else None

    result.update(
        {
            "signal": sig.name,
            "statuses": statuses,
            "took_over_log_lines": len(took_over_log),
            "a_expiry_after_kill_s": [after_kill(expiry[0]), after_kill(expiry[1])],
            "takeover_allowed_after_kill_s": (
                [after_kill(expiry[0]) + 2 * renew_s, after_kill(expiry[1]) + 2 * renew_s]
                if sig == signal.SIGKILL and expiry[0] is not None
                else None
            ),
            "timeline_s": timeline,
            "signals_seconds": signals_s,
            "takeover_latency_source": source,
            "takeover_latency_s": _spread(takeover_offsets),
            "takeover_passes": _passes(takeover_offsets),
            "completion_latency_s": _spread(finished) if case == "kill-go" else None,
            "expected_bound_s": ttl_s + 2 * renew_s + renew_s + poll_s,
            "expected_bound_batched_s": ttl_s + 2 * renew_s + passes_needed * renew_s + poll_s,
            "passes_needed": passes_needed,
        }
    )
    return result


# ------------------------------------------------------------------------------------------ fencing cost


def scenario_fencing_cost(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    """The throughput (or, with --fencing-base backlog, the backlog) scenario with OWNERSHIP
    "workflow-lease" and "none" on one engine, alternately, --fencing-rounds times each (each run on
    a flushed database, which also clears the ownership-mode marker)."""
    from django.core.management import call_command

    base = options.fencing_base
    modes = ["workflow-lease", "none"]
    runs = []
    for round_ in range(options.fencing_rounds):
        for mode in modes if round_ % 2 == 0 else modes[::-1]:
            call_command("flush", interactive=False, verbosity=0)
            print(f"\nfencing-cost: {base}, OWNERSHIP={mode!r}, round {round_ + 1}", flush=True)
            r = _three_noop_run(
                base,
                options,
                stamp,
                engine_first=base == "throughput",
                weft={"OWNERSHIP": mode},
                label=f"fencing-{base}-{mode}-{round_ + 1}",
            )
            r["mode"], r["round"] = mode, round_ + 1
            runs.append(r)

    def summary(mode: str) -> dict[str, Any]:
        mine = [r for r in runs if r["mode"] == mode]
        claim = [r["db"]["tables"].get("weft_django_workflowclaim", {}) for r in mine]
        return {
            "runs": len(mine),
            "workflows_per_s": [r["workflows_per_s"] for r in mine],
            "workflows_per_s_median": statistics.median(r["workflows_per_s"] for r in mine),
            "latency_p50_median": statistics.median(r["latency_s"]["p50"] for r in mine),
            "engine_cpu_ms_per_step_median": statistics.median(
                r["engine_cpu_ms_per_step"] for r in mine if r["engine_cpu_ms_per_step"] is not None
            ),
            "engine_transactions_per_step_median": statistics.median(r["engine_transactions_per_step"] for r in mine),
            "row_writes_per_step_median": statistics.median(r["row_writes_per_step"] for r in mine),
            "claim_row_updates_per_workflow": [
                c.get("upd", 0) / r["workflows"] for c, r in zip(claim, mine, strict=True)
            ],
            # traced runs (--trace-sql) only
            "claim_statements_per_step": [
                r["engine_sql"]["claim_statements"] / r["steps"] for r in mine if "engine_sql" in r
            ],
            "statements_per_step": [r["engine_sql"]["statements_per_step"] for r in mine if "engine_sql" in r],
        }

    by_mode = {mode: summary(mode) for mode in modes}
    return {
        "scenario": "fencing-cost",
        "base": base,
        "workflows": options.workflows,
        "engine_concurrency": options.engine_concurrency,
        "analyzed_before_engine": bool(options.analyze) and base == "backlog",
        "by_mode": by_mode,
        "ratio_none_over_workflow_lease": by_mode["none"]["workflows_per_s_median"]
        / by_mode["workflow-lease"]["workflows_per_s_median"],
        "runs": runs,
    }


SCENARIOS = {
    "throughput": scenario_throughput,
    "backlog": scenario_backlog,
    "takeover": scenario_takeover,
    "fencing-cost": scenario_fencing_cost,
    "parked": scale.scenario_parked,  # issue 9 (f), benchmarks/scale.py
    "timers": scale.scenario_timers,  # issue 9 (g), benchmarks/scale.py
}


# ------------------------------------------------------------------------------------------ report


def machine(server: dict[str, Any]) -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import django

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"

    dirty = git("status", "--porcelain", "--", "weft_django")
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "git": git("rev-parse", "--short", "HEAD") + (" + uncommitted changes in weft_django/" if dirty else ""),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "loadavg_before": list(os.getloadavg()),
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgresql": server["server_version"],
        "pg_settings": server["settings"],
        "platform": platform.platform(),
    }


def _report_takeover(r: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"scenario: takeover ({r['workflows']} parked bench.parked workflows held by engine A, engine B "
        f"running beside it; claims polled every {r['poll_seconds'] * 1000:.0f} ms)",
    ]
    for c in r["cases"]:
        t = c["timeline_s"]
        lat = c["takeover_latency_s"]
        rows = [
            (
                "settings",
                f"WORKFLOW_CLAIM_TTL {c['workflow_claim_ttl']}, RENEW_INTERVAL {c['workflow_claim_renew_interval']}, "
                f"POLL_INTERVAL {c['poll_interval_s'] * 1000:.0f}ms, CLAIM_BATCH_SIZE {c['claim_batch_size']}",
            ),
            ("A exited", f"{_fmt(t['a_exited'])} s after the {c['signal']} (exit code {c['a_exit_code']})"),
        ]
        if c["signal"] == "SIGKILL":
            low, high = c["a_expiry_after_kill_s"]
            allowed = c["takeover_allowed_after_kill_s"]
            rows.append(
                (
                    "A's claims expire / may be taken",
                    f"{_fmt(low)}..{_fmt(high)} s / {_fmt(allowed[0])}..{_fmt(allowed[1])} s after the kill "
                    "(expires_at; + 2 x renew)",
                )
            )
        else:
            rows.append(("A holds no claim", f"{_fmt(t['a_holds_none'])} s after the SIGTERM (released)"))
        if c["case"] == "kill-go":
            comp = c["completion_latency_s"]
            rows += [
                ('"go" sent to all', f"in {_fmt(c['signals_seconds'])} s, right after the kill"),
                ("all completed (20 ms polls)", f"{_fmt(t['all_completed'])} s after the kill"),
                (
                    "per workflow, kill -> finished_at",
                    f"min {comp['min']:.2f}  p50 {comp['p50']:.2f}  p99 {comp['p99']:.2f}  max {comp['max']:.2f} s",
                ),
            ]
        else:
            rows.append(("B holds all (20 ms polls)", f"{_fmt(t['b_all'])} s after the {c['signal']}"))
        rows += [
            (
                "per claim, kill -> B's takeover",
                f"min {lat['min']:.2f}  p50 {lat['p50']:.2f}  p99 {lat['p99']:.2f}  max {lat['max']:.2f} s "
                f"({c['takeover_latency_source']})",
            ),
            (
                "B's passes (s after, claims)",
                ", ".join(f"+{first:.2f}: {count}" for first, count in c["takeover_passes"]),
            ),
        ]
        if c["signal"] == "SIGKILL":
            rows.append(
                (
                    "expected bound",
                    f"TTL + 2 x renew + renew + poll = {c['expected_bound_s']:.1f} s; with "
                    f"{c['passes_needed']} takeover passes of {c['claim_batch_size']} (one per renew interval): "
                    f"{c['expected_bound_batched_s']:.1f} s",
                )
            )
        lines += ["", f"  case {c['case']}: {c['description']}", table(rows)]
    return lines


def _report_fencing(r: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"scenario: fencing-cost ({r['base']}{', ANALYZE after the starts' if r['analyzed_before_engine'] else ''}, "
        f"{r['workflows']} workflows of 3 no-op steps, 1 engine, --concurrency {r['engine_concurrency']})",
    ]
    rows = []
    for run in r["runs"]:
        lat = run["latency_s"]
        rows.append(
            (
                f"round {run['round']}, OWNERSHIP {run['mode']}",
                f"{run['workflows_per_s']:.1f} wf/s = {run['steps_per_s']:.0f} steps/s; latency p50 {lat['p50']:.2f} s "
                f"p99 {lat['p99']:.2f} s; engine CPU {_fmt(run['engine_cpu_ms_per_step'])} ms/step; "
                f"{run['engine_transactions_per_step']:.2f} engine tx/step; "
                f"{run['row_writes_per_step']:.2f} row writes/step"
                + (
                    f"; traced: {run['engine_sql']['statements_per_step']:.2f} statements/step, "
                    f"{run['engine_sql']['transactions_per_step']:.2f} tx/step"
                    if "engine_sql" in run
                    else ""
                ),
            )
        )
    for mode, s in r["by_mode"].items():
        rows.append(
            (
                f"median, {mode}",
                f"{s['workflows_per_s_median']:.1f} wf/s; engine CPU {s['engine_cpu_ms_per_step_median']:.2f} ms/step; "
                f"claim row updates per workflow {', '.join(f'{v:.2f}' for v in s['claim_row_updates_per_workflow'])}"
                + (
                    f"; traced: claim statements/step {', '.join(f'{v:.3f}' for v in s['claim_statements_per_step'])}"
                    f" of {', '.join(f'{v:.3f}' for v in s['statements_per_step'])}"
                    if s["statements_per_step"]
                    else ""
                ),
            )
        )
    rows.append(("ratio none / workflow-lease", f"{r['ratio_none_over_workflow_lease']:.3f} (median workflows/s)"))
    return [*lines, table(rows)]


EXTRA_REPORTS = {
    "takeover": _report_takeover,
    "fencing-cost": _report_fencing,
    "parked": scale.report_parked,
    "timers": scale.report_timers,
}


def report(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "weft_django benchmarks",
        table(
            [
                ("date", meta["date"]),
                ("machine", f"{meta['nproc']} CPUs ({meta['cpu']}), load avg before {meta['loadavg_before'][0]:.2f}"),
                (
                    "PostgreSQL",
                    f"{meta['postgresql']} (synchronous_commit={meta['pg_settings'].get('synchronous_commit')}, "
                    f"fsync={meta['pg_settings'].get('fsync')}), same machine",
                ),
                ("code", meta["git"]),
                ("Python / Django", f"{meta['python']} / {meta['django']}, CONN_MAX_AGE={meta['conn_max_age']}"),
                ("statement counts", meta["statement_source"]),
            ]
        ),
    ]
    for r in results:
        if r["scenario"] in EXTRA_REPORTS:
            lines += EXTRA_REPORTS[r["scenario"]](r)
            continue
        lat, first = r["latency_s"], r["first_step_delay_s"]
        db = r["db"]
        rows = [
            ("workflows (3 no-op activities each)", f"{r['workflows']}  ({r['statuses']})"),
            (
                "engine",
                f"1 subprocess, --concurrency {r['engine_concurrency']}, POLL_INTERVAL 100ms"
                f"{''.join(f', {k}={v}' for k, v in r.get('weft_overrides', {}).items())}"
                f"{', SQL traced' if r['sql_traced'] else ''}"
                f"{', ANALYZE after the starts' if r.get('analyzed_before_engine') else ''}",
            ),
            (
                "start phase (1 client, sequential)",
                f"{r['start_seconds']:.2f} s  = {r['starts_per_s']:.0f} starts/s "
                f"({'engine running' if r['starts_with_engine_running'] else 'no engine'})",
            ),
            (
                f"{r['timed_from']} -> last completion",
                f"{r['total_seconds_db']:.2f} s (db clock); "
                f"{r['total_seconds_client']:.2f} s (client, 50 ms polls"
                f"{'' if r['starts_with_engine_running'] else ', from engine spawn'})",
            ),
            ("throughput", f"{r['workflows_per_s']:.1f} workflows/s = {r['steps_per_s']:.1f} steps/s"),
            (
                "latency created -> finished",
                f"p50 {lat['p50']:.2f} s  p90 {lat['p90']:.2f} s  p99 {lat['p99']:.2f} s  max {lat['max']:.2f} s",
            ),
            (
                "created -> first step started",
                f"p50 {first['p50']:.2f} s  p99 {first['p99']:.2f} s  max {first['max']:.2f} s",
            ),
            (
                "engine CPU (user+sys, whole process)",
                (
                    f"{r['engine_cpu_seconds']:.2f} s; "
                    + (
                        f"{r['engine_cpu_seconds'] - r['engine_boot_cpu_seconds']:.2f} s after start-up"
                        if r["engine_boot_cpu_seconds"] is not None
                        else "start-up included"
                    )
                    + f" = {r['engine_cpu_ms_per_step']:.2f} ms per step"
                )
                if r["engine_cpu_seconds"] is not None
                else "n/a",
            ),
            ("client CPU (this process)", f"{r['client_cpu_seconds']:.2f} s"),
            (
                "transactions, whole database",
                f"{db['xact_commit']} commits, {db['xact_rollback']} rollbacks, {db['sessions']} connections opened",
            ),
            (
                "  of which client",
                f"{r['client']['transactions_total']} "
                f"({r['client']['start_transactions_per_start']:.2f}/start, "
                f"{r['client']['start_statements_per_start']:.2f} statements/start; "
                f"{r['client']['poll_transactions']} progress polls)",
            ),
            (
                "  of which engine (the rest)",
                f"{r['engine_transactions']}  = {r['engine_transactions_per_step']:.2f} per committed step",
            ),
            (
                "row writes (ins+upd+del)",
                f"{db['tup_inserted']}+{db['tup_updated']}+{db['tup_deleted']}  = "
                f"{r['row_writes_per_step']:.2f} per step "
                f"({r['row_writes_per_step_engine']:.2f} excluding the starts' rows)",
            ),
        ]
        for name, t in sorted(db["tables"].items()):
            short = name.replace("weft_django_", "")
            rows.append(
                (
                    f"  {short}",
                    f"ins {t['ins']}  upd {t['upd']} (hot {t['hot_upd']})  del {t['del']}  "
                    f"seq_scan {t['seq_scan']}  idx_scan {t['idx_scan']}",
                )
            )
        if "engine_sql" in r:
            e = r["engine_sql"]
            rows += [
                (
                    "engine SQL (traced)",
                    f"{e['statements']} statements = {e['statements_per_step']:.2f}/step; "
                    f"{e['transactions']} transactions = {e['transactions_per_step']:.2f}/step "
                    f"({e['write_transactions_per_step']:.2f} writing)",
                ),
            ]
            for thread, t in e["by_thread"].items():
                rows.append((f"  thread {thread}", f"{t['statements']} statements, {t['transactions']} transactions"))
        lines += ["", f"scenario: {r['scenario']}", table(rows)]
        if "engine_sql" in r:
            lines += ["", "  engine statements by shape (calls, per step, thread, SQL):"]
            for s in r["engine_sql"]["top_shapes"][:15]:
                sql = s["sql"] if len(s["sql"]) <= 110 else s["sql"][:107] + "..."
                lines.append(f"  {s['calls']:>7}  {s['calls'] / r['steps']:5.2f}  {s['thread']:<12}  {sql}")
        if "pg_stat_statements_top" in r:
            lines += ["", "  pg_stat_statements (calls, SQL):"]
            for s in r["pg_stat_statements_top"][:15]:
                lines.append(f"  {s['calls']:>7}  {' '.join(s['sql'].split())[:110]}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--scenarios", default="throughput", help=f"comma-separated: {', '.join(SCENARIOS)}")
    parser.add_argument("--engine-concurrency", type=int, default=8)
    parser.add_argument("--engine-verbosity", type=int, default=1, help="weft_engine -v (2 = INFO logs)")
    parser.add_argument(
        "--conn-max-age",
        default=None,
        help='CONN_MAX_AGE for the client and the engine: seconds, or "none" for persistent '
        "connections (default: Django's default, 0)",
    )
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="backlog: ANALYZE the database after the starts, before the engine starts "
        "(planner statistics as a long-running database would have them)",
    )
    parser.add_argument(
        "--py-spy", action="store_true", help="sample the engine with py-spy; collapsed stacks in benchmarks/results/"
    )
    parser.add_argument(
        "--trace-sql",
        action="store_true",
        help="count the engine's statements by shape (Django execute wrapper in the engine)",
    )
    parser.add_argument(
        "--weft",
        dest="weft_items",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a WEFT setting for every engine subprocess (JSON value, else a string), e.g. --weft CLAIM_BATCH_SIZE=200",
    )
    parser.add_argument("--takeover-workflows", type=int, default=200, help="takeover: parked workflows (default 200)")
    parser.add_argument(
        "--takeover-timings",
        default="3s/1s,30s/5s",
        help="takeover: comma-separated WORKFLOW_CLAIM_TTL/WORKFLOW_CLAIM_RENEW_INTERVAL pairs (default 3s/1s,30s/5s)",
    )
    parser.add_argument(
        "--takeover-cases",
        default=",".join(TAKEOVER_CASES),
        help=f"takeover: comma-separated, of {', '.join(TAKEOVER_CASES)} (default all)",
    )
    parser.add_argument(
        "--fencing-base",
        choices=["throughput", "backlog"],
        default="throughput",
        help="fencing-cost: the scenario run under each OWNERSHIP mode (default throughput)",
    )
    parser.add_argument(
        "--fencing-rounds", type=int, default=2, help="fencing-cost: runs per mode, alternating (default 2)"
    )
    scale.add_arguments(parser)  # --parked-workflows, --idle-seconds, --timer-counts, --ticks
    options = parser.parse_args(argv)
    options.weft = {}
    for item in options.weft_items:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--weft {item!r}: expected KEY=VALUE")
        try:
            options.weft[key.strip()] = json.loads(value)
        except ValueError:
            options.weft[key.strip()] = value
    try:
        options.takeover_timings = [
            tuple(pair.strip().split("/", 1)) for pair in options.takeover_timings.split(",") if pair.strip()
        ]
        for ttl, renew in options.takeover_timings:
            _seconds(ttl), _seconds(renew)
    except ValueError as exc:
        parser.error(f"--takeover-timings: {exc}")
    options.takeover_cases = [c.strip() for c in options.takeover_cases.split(",") if c.strip()]
    if set(options.takeover_cases) - set(TAKEOVER_CASES):
        parser.error(f"--takeover-cases: known cases are {', '.join(TAKEOVER_CASES)}")
    scenarios = [s.strip() for s in options.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")

    if options.conn_max_age is not None:
        os.environ["WEFT_BENCH_CONN_MAX_AGE"] = options.conn_max_age  # read by settings.py, inherited by the engine
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from benchmarks import sqltrace

    recreate_database()
    call_command("migrate", verbosity=0)
    server = server_facts()
    options.pgss = server["pg_stat_statements"]
    meta = machine(server)
    meta["statement_source"] = (
        "pg_stat_statements"
        if options.pgss
        else "pg_stat_statements not preloaded: transactions from pg_stat_database.xact_commit, row writes from "
        "pg_stat_user_tables" + ("; engine statements traced in-process (--trace-sql)" if options.trace_sql else "")
    )
    meta["conn_max_age"] = settings.DATABASES["default"]["CONN_MAX_AGE"]
    meta["command"] = " ".join(["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])])
    sqltrace.install()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    results = []
    for index, name in enumerate(scenarios):
        if index:
            call_command("flush", interactive=False, verbosity=0)
        results.append(SCENARIOS[name](options, stamp))
    meta["loadavg_after"] = list(os.getloadavg())
    print(report(meta, results))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}.json"
    out.write_text(json.dumps({"machine": meta, "results": results}, indent=1, default=str))
    print(f"\nwritten: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
