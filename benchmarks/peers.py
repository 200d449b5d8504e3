"""Side-by-side: weft_django against DBOS, Celery and Procrastinate, and the raw-SQL ceiling, in ONE run
against the same PostgreSQL (each system its own database, dropped and re-created), back to back.

    .venv-bench/bin/python -m benchmarks.peers [--workflows 1000] [--latency 200] [--signals 200]
                                              [--systems weft,dbos,celery,procrastinate,raw] [--rounds 1]

Needs the bench venv (peer packages stay out of the project's venv):

    python3.11 -m venv .venv-bench
    .venv-bench/bin/pip install -e . -r benchmarks/requirements-bench.txt

Each system runs in its own subprocess (benchmarks/peer_apps/<system>_bench.py, benchmarks/raw_sql.py)
that writes a JSON result; this script records the load average before each, then prints one table
with every figure as a ratio to weft_django measured in the same round, and writes everything to
``benchmarks/results/<timestamp>-peers.json``. Scenarios (see docs/benchmarks.md):

(a) N workflows of three no-op activities, each started by its own client call, sequentially, as fast
    as one client can; one engine / worker; timed from the first start to the last completion.
(b) the same one at a time: start, wait for the result, next (per-workflow latency).
(c) signal-to-resume: a parked workflow waiting for a message; send it and wait for the result.
Raw SQL: the rows weft_django writes per workflow, with 1, 16 and 100 workflows' steps per transaction.
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

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SYSTEMS = {
    "weft": "benchmarks.peer_apps.weft_bench",
    "dbos": "benchmarks.peer_apps.dbos_bench",
    "celery": "benchmarks.peer_apps.celery_bench",
    "procrastinate": "benchmarks.peer_apps.procrastinate_bench",
    "raw": "benchmarks.raw_sql",
}


def _run(system: str, options: argparse.Namespace, stamp: str, round_no: int) -> dict[str, Any]:
    out = RESULTS / f"{stamp}-peers-{system}-r{round_no}.json"
    module = SYSTEMS[system]
    if system == "raw":
        command = [sys.executable, "-m", module, "--workflows", str(options.workflows), "--json", str(out)]
        command += ["--single-workflows", str(options.raw_single)]
    else:
        command = [sys.executable, "-m", module, "--out", str(out), "--workflows", str(options.workflows)]
        if system in ("weft", "dbos", "celery"):
            command += ["--latency", str(options.latency)]
        if system in ("weft", "dbos"):
            command += ["--signals", str(options.signals)]
        if system == "weft":
            command += ["--trace-workflows", str(options.trace_workflows if round_no == 1 else 0)]
        if system in ("weft", "celery", "procrastinate"):
            command += ["--stamp", f"{stamp}-r{round_no}"]
    load = os.getloadavg()
    print(f"\n== round {round_no}: {system} (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", flush=True)
    began = time.monotonic()
    code = subprocess.run(command, cwd=ROOT).returncode
    if code != 0 or not out.exists():
        return {"system": system, "error": f"exit code {code}", "command": " ".join(command), "loadavg_before": load}
    result = json.loads(out.read_text())
    result["loadavg_before"] = load
    result["wall_seconds"] = time.monotonic() - began
    result["command"] = " ".join(["python", *command[1:]])
    return result


def machine() -> dict[str, Any]:
    import psycopg

    from benchmarks.peer_apps import common

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with psycopg.connect(common.conninfo("postgres"), autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        preload = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync', 'shared_buffers')"
            ).fetchall()
        )
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": version,
        "pg_stat_statements_preloaded": "pg_stat_statements" in preload,
        "pg_settings": settings,
        "git": git.strip() + (" + uncommitted changes" if dirty.strip() else ""),
    }


# ------------------------------------------------------------------------------------------ report


def _fmt(v: float | None, digits: int = 1) -> str:
    if v is None or v != v:  # NaN
        return "n/a"
    return f"{v:,.{digits}f}"


def _ratio(num: float | None, den: float | None) -> str:
    if not num or not den or num != num or den != den:
        return "n/a"
    return f"{num / den:.2f}x"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join([line, sep, *body])


def report_round(results: dict[str, dict[str, Any]]) -> str:
    weft = results.get("weft", {})
    out = []
    wa = weft.get("a", {}).get("workflows_per_s")
    # (a)
    rows = []
    for key, label, part in (
        ("weft", "weft_django", "a"),
        ("dbos", "DBOS start_workflow", "a"),
        ("dbos", "DBOS queue.enqueue", "a_queue"),
        ("celery", "Celery chain (Redis)", "a"),
        ("procrastinate", "Procrastinate", "a"),
    ):
        r = results.get(key, {})
        a = r.get(part)
        if not a:
            if key in results:
                rows.append([label, "failed" if "error" in r else "-", "", "", "", ""])
            continue
        rows.append(
            [
                label,
                _fmt(a["workflows_per_s"]),
                _fmt(a["starts_per_s"], 0),
                _fmt(a["total_seconds"], 2),
                _ratio(wa, a["workflows_per_s"]) if key != "weft" else "1.00x",
                _fmt(r["loadavg_before"][0], 2),
            ]
        )
    if rows:
        out += [
            "(a) N workflows x 3 no-op steps, one client starting as fast as it can, to completion",
            table(["system", "workflows/s", "starts/s", "seconds", "weft_django / peer", "load avg"], rows),
        ]
    # (b), (c)
    for part, title in (
        ("b", "(b) one at a time: start -> result, per workflow"),
        ("c", "(c) signal-to-resume of a parked workflow: send -> result returned"),
    ):
        ref = weft.get(part, {})
        rows = []
        for key, label in (("weft", "weft_django"), ("dbos", "DBOS"), ("celery", "Celery chain (Redis)")):
            r = results.get(key, {}).get(part)
            if not r:
                continue
            rows.append(
                [
                    label,
                    str(r["n"]),
                    _fmt(r["p50_ms"]),
                    _fmt(r["p99_ms"]),
                    _fmt(r["per_s"]),
                    _ratio(r["p50_ms"], ref.get("p50_ms")) if key != "weft" else "1.00x",
                    _fmt(results[key]["loadavg_before"][0], 2),
                ]
            )
        if rows:
            out += [
                "",
                title,
                table(["system", "n", "p50 ms", "p99 ms", "per s", "peer p50 / weft_django p50", "load avg"], rows),
            ]
    # raw
    raw = results.get("raw", {})
    if raw.get("modes"):
        rows = [
            [
                f"{m['batch']} workflows' steps per transaction",
                _fmt(m["workflows_per_s"]),
                _fmt(m["commits_per_s"], 0),
                f"{m['row_writes_per_step']:.2f}",
                _ratio(wa, m["workflows_per_s"]),
            ]
            for m in raw["modes"]
        ]
        out += [
            "",
            f"raw-SQL ceiling (psycopg 3, same rows as weft_django; load avg {raw['loadavg_before'][0]:.2f})",
            table(["batching", "workflows/s", "commits/s", "row writes/step", "weft_django (a) / raw"], rows),
        ]
    # database cost per step
    rows = []
    if "engine_sql" in weft:
        e = weft["engine_sql"]
        rows.append(
            [
                "weft_django engine, traced (statements / transactions / writing tx)",
                f"{e['statements_per_step']:.2f} / {e['transactions_per_step']:.2f} / "
                f"{e['write_transactions_per_step']:.3f}",
            ]
        )
    if "engine_sql_b" in weft:
        e = weft["engine_sql_b"]
        rows.append(
            [
                "weft_django engine, traced, (b) one at a time: per WORKFLOW (statements / tx / writing tx)",
                f"{e['statements_per_workflow']:.1f} / {e['transactions_per_workflow']:.1f} / "
                f"{e['write_transactions_per_workflow']:.1f}",
            ]
        )
    for part in ("b", "c"):
        if "sessions_per_workflow" in weft.get(part, {}):
            rows.append(
                [
                    f"weft_django ({part}): PostgreSQL connections opened per workflow (client waits + engine)",
                    f"{weft[part]['sessions_per_workflow']:.2f}",
                ]
            )
    for key, label, part in (
        ("weft", "weft_django (client+engine+LISTEN)", "a"),
        ("dbos", "DBOS start_workflow", "a"),
        ("dbos", "DBOS queue", "a_queue"),
        ("procrastinate", "Procrastinate", "a"),
    ):
        a = results.get(key, {}).get(part)
        if a and "db" in a:
            rows.append(
                [
                    f"{label}: commits, whole database / row writes",
                    f"{a['db_commits_per_step']:.2f} / {a['row_writes_per_step']:.2f}",
                ]
            )
    if rows:
        out += ["", "database work (per committed step of (a) unless stated)", table(["", "value"], rows)]
    if "engine_sql" in weft:
        steps = 3 * weft["engine_sql"]["workflows"]
        out += ["", "weft_django engine statements by shape, traced (a) (calls, per step, SQL):"]
        for shape in weft["engine_sql"]["top_shapes"][:8]:
            out.append(f"  {shape['calls']:>6}  {shape['calls'] / steps:5.2f}  {' '.join(shape['sql'].split())[:100]}")
    errors = [f"{k}: {v['error']}" for k, v in results.items() if "error" in v]
    if errors:
        out += ["", "FAILED: " + "; ".join(errors)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--latency", type=int, default=200, help="(b): workflows one at a time")
    parser.add_argument("--signals", type=int, default=200, help="(c): parked workflows signalled one at a time")
    parser.add_argument("--trace-workflows", type=int, default=1000, help="weft: traced engine run (round 1)")
    parser.add_argument("--raw-single", type=int, default=500, help="raw SQL: workflows at batch size 1")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--rounds", type=int, default=1, help="repeat; even rounds run the systems in reverse order")
    options = parser.parse_args(argv)
    systems = [s.strip() for s in options.systems.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    meta = machine()
    meta["command"] = " ".join(["python -m benchmarks.peers", *(argv if argv is not None else sys.argv[1:])])
    rounds = []
    for round_no in range(1, options.rounds + 1):
        # even rounds run the systems in reverse order, so a load trend does not favour one side
        order = systems if round_no % 2 else list(reversed(systems))
        results = {s: _run(s, options, stamp, round_no) for s in order}
        rounds.append({s: results[s] for s in systems})
    meta["loadavg_after"] = os.getloadavg()
    lines = [
        "",
        "weft_django vs peers, same PostgreSQL, one run",
        f"date {meta['date']}; {meta['nproc']} CPUs ({meta['cpu']}), {meta['memory_gb']} GB; Linux {meta['kernel']}; "
        f"Python {meta['python']}; PostgreSQL {meta['postgresql']} same machine "
        f"(synchronous_commit={meta['pg_settings'].get('synchronous_commit')}, "
        f"fsync={meta['pg_settings'].get('fsync')}); "
        f"code {meta['git']}; pg_stat_statements preloaded: {meta['pg_stat_statements_preloaded']}",
        f"N = {options.workflows} (a), {options.latency} (b), {options.signals} (c)",
    ]
    for i, results in enumerate(rounds, 1):
        lines += ["", f"--- round {i} ---", report_round(results)]
    if len(rounds) > 1 and all("a" in r.get("weft", {}) for r in rounds):
        med = statistics.median(r["weft"]["a"]["workflows_per_s"] for r in rounds)
        lines += ["", f"weft_django (a), median of {len(rounds)} rounds: {med:.1f} workflows/s"]
    text = "\n".join(lines)
    print(text)
    out = RESULTS / f"{stamp}-peers.json"
    out.write_text(json.dumps({"machine": meta, "rounds": rounds, "report": text}, indent=1, default=str))
    print(f"\nwritten: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
