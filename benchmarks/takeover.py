"""The ``takeover`` scenario of benchmarks/run.py: engine A holds the claims of N parked workflows,
engine B runs beside it, A is SIGKILLed or SIGTERMed, and the time until B holds every claim (or every
workflow completed) is measured per claim TTL/renew pair and case."""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import POLL_SECONDS, RESULTS, EngineProcess, percentile

TAKEOVER_POLL_SECONDS = 0.02
TAKEOVER_CASES = {
    "kill": "SIGKILL engine A; timed until engine B holds all N claims",
    "term": "SIGTERM engine A (graceful: it releases its claims); timed until engine B holds all N claims",
    "kill-go": 'SIGKILL engine A, then "go" to all N at once; timed until all N completed',
}


def duration_seconds(value: Any) -> float:
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
    ttl_s, renew_s = duration_seconds(ttl), duration_seconds(renew)
    poll_s = duration_seconds(effective["POLL_INTERVAL"])
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
