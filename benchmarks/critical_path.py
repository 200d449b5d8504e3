"""Where the time of one workflow goes: a timeline of every statement of the client and the engine.

    PYTHONPATH=$PWD python -m benchmarks.critical_path [--workflows 50] [--signals 50] [--workflow bench.three_noop]

Database ``<WEFT_BENCH_PEER_PREFIX>critical`` (dropped, re-created, migrated). ONE engine under
``benchmarks/sqltrace.py`` with ``WEFT_BENCH_TIMELINE`` (each statement's wall-clock start and duration);
the client traces its own statements and marks "start" and "result returned". For (b) (start ->
result, one at a time) and (c) (signal -> result of a parked workflow) it prints, per position in the
sequence, the median offset from the client's first mark, the median duration and the statement shape,
so the gaps between statements (wake-ups, Python work, the NOTIFY hops) show up too. The LISTEN
connections and the client's result reader (psycopg, outside Django) are not traced.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.peer_apps import common

ROOT = Path(__file__).resolve().parents[1]
DBNAME = os.environ.get("WEFT_BENCH_PEER_PREFIX", "weft_peer_") + "critical"


def _engine(timeline: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, WEFT_BENCH_TIMELINE=str(timeline))
    command = [sys.executable, "-m", "benchmarks.sqltrace", "--out", str(timeline) + ".counts", "--"]
    command += ["weft_engine", "--engine-id", "critical-1", "--concurrency", "8"]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _windows(marks: list[tuple[float, str]], begin: str, end: str) -> list[tuple[float, float]]:
    out, opened = [], None
    for t, label in marks:
        if label == begin:
            opened = t
        elif label == end and opened is not None:
            out.append((opened, t))
            opened = None
    return out


def _profile(events: list[list[Any]], windows: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Per position in each window's event sequence: median offset (ms), median duration, shape."""
    sequences = []
    for t0, t1 in windows:
        inside = sorted((e for e in events if t0 <= e[0] <= t1), key=lambda e: e[0])
        sequences.append(
            [(e[0] - t0, e[1], e[2], e[3]) for e in inside] + [(t1 - t0, 0.0, "client", "result returned")]
        )
    length = statistics.mode(len(s) for s in sequences)
    same = [s for s in sequences if len(s) == length]
    rows = []
    for i in range(length):
        rows.append(
            {
                "at_ms": statistics.median(s[i][0] for s in same) * 1000,
                "ms": statistics.median(s[i][1] for s in same) * 1000,
                "thread": same[0][i][2],
                "sql": same[0][i][3][:110],
            }
        )
    return [{"windows": len(sequences), "typical": len(same)}, *rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflows", type=int, default=50, help="(b): workflows one at a time")
    parser.add_argument("--signals", type=int, default=50, help="(c): parked workflows signalled one at a time")
    parser.add_argument("--workflow", default="bench.three_noop", help="(b)'s workflow (registered name)")
    args = parser.parse_args()
    os.environ["WEFT_BENCH_PG_NAME"] = DBNAME
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ.setdefault("WEFT_BENCH_OVERRIDES", json.dumps({"POLL_INTERVAL": "1s"}))
    common.recreate_database(DBNAME)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    os.environ["WEFT_BENCH_TIMELINE"] = "client"
    from benchmarks import sqltrace

    sqltrace.TIMELINE = "client"
    sqltrace.install()
    import weft_django as weft
    from benchmarks.benchapp.workflows import parked
    from weft_django.models import Engine as EngineRow
    from weft_django.models import WorkflowClaim

    tmp = Path(tempfile.mkdtemp(prefix="weft-critical-"))
    engine = _engine(tmp / "engine.json", tmp / "engine.log")
    try:
        common.wait_until(lambda: EngineRow.objects.filter(id="critical-1").exists(), 60, what="engine registered")
        time.sleep(0.5)
        for i in range(5):  # warm up
            weft.start(args.workflow, args=[i]).result(timeout=30)
        for i in range(args.workflows):
            sqltrace.mark("start")
            weft.start(args.workflow, args=[i]).result(timeout=30)
            sqltrace.mark("result returned")
        handles = [weft.start(parked, args=[i]) for i in range(args.signals)]
        ids = [h.id for h in handles]
        common.wait_until(
            lambda: WorkflowClaim.objects.filter(workflow_id__in=ids, engine_id="critical-1").count() == len(ids), 60
        )
        time.sleep(1.0)
        for i, h in enumerate(handles):
            sqltrace.mark("signal")
            h.signal("go", i)
            h.result(timeout=30)
            sqltrace.mark("result returned")
    finally:
        engine.terminate()
        engine.wait(30)
    client = [[t, d, "client:" + g, s] for t, d, g, s in sqltrace._timeline]
    engine_events = [[t, d, "engine:" + g, s] for t, d, g, s in json.loads((tmp / "engine.json").read_text())]
    marks = [(t, s) for t, d, g, s in sqltrace._timeline if d == 0.0 and s in ("start", "signal", "result returned")]
    events = [e for e in client if e[3] not in ("start", "signal", "result returned")] + engine_events
    for title, begin in (("(b) start -> result", "start"), ("(c) signal -> result", "signal")):
        windows = _windows(marks, begin, "result returned")
        totals = sorted(t1 - t0 for t0, t1 in windows)
        head, *rows = _profile(events, windows)
        print(
            f"\n{title}: {head['windows']} windows, p50 {statistics.median(totals) * 1000:.2f} ms "
            f"(sequence of the {head['typical']} typical ones)"
        )
        print(f"| {'at ms':>6} | {'ms':>5} | thread | statement |")
        print("|---|---|---|---|")
        for row in rows:
            print(f"| {row['at_ms']:6.2f} | {row['ms']:5.2f} | {row['thread']} | {row['sql']} |")
    from django.db import connections

    from weft_django.waits import close_connections

    close_connections()
    connections.close_all()
    common.drop_database(DBNAME)


if __name__ == "__main__":
    main()
