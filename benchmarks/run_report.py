"""The report of benchmarks/run.py: the machine facts (``machine``) and the results table printed at
the end of a run (``report``), one section per scenario."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from benchmarks import scale
from benchmarks.harness import ROOT, _fmt, table


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
