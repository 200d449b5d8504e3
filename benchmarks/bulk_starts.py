"""Bulk and concurrent starts (issue 16, items 1 and 2), peers in the same run; prints tables.

    PYTHONPATH=$PWD /work/venv-bench/bin/python -m benchmarks.bulk_starts [--workflows 10000]
        [--parts many,concurrent] [--systems weft,dbos,raw] [--steps regular|local] [--per-client 400]
        [--json FILE]

Databases (dropped and re-created): ``<prefix>weft``, ``<prefix>dbos``, ``<prefix>raw`` with the prefix
WEFT_BENCH_PEER_PREFIX (default here ``weft_bulk_``).

many: N workflows of three no-op activities (``bench.three_noop``) run to completion by ONE engine
    (``weft_engine --concurrency 8``, shipped defaults, as benchmarks/peer_apps/weft_bench.py), started
    by ONE ``weft.start_many`` call; timed from before the call until a 20 ms poll sees N completed.
    Against, in the same run: DBOS starting N with its fastest APIs from one client loop
    (``DBOS.start_workflow`` and ``queue.enqueue``, benchmarks/peer_apps/dbos_bench.py, the better of
    the two is the ratio's denominator) and the raw-SQL ceiling at 100 workflows' steps per transaction
    (benchmarks/raw_sql.py, the same rows, no engine). ``--steps local``: weft_django runs
    ``bench.three_local`` (the same three no-op steps as local activities: in the engine's process,
    results committed with the run's end, at-least-once, as DBOS steps are), and the ceiling is the raw
    pattern of those rows (``raw_sql --pattern local``: 3 commits per group instead of 8).
concurrent: ``weft.start(three_noop)`` from 1, 4 and 16 client threads of this process and from 4
    client processes, each client ``--per-client`` starts back to back, no engine running (the start
    path alone); starts/s over the wall time and p50/p99 of one start's latency. Each configuration
    runs with the start's NOTIFY inside its transaction (``before``: how start() sent it up to issue
    16), after its commit in a second round trip (``after``: session 8's path), and after its commit in
    the same round trip (``pipelined``: the shipped path, store/runs.py ``NOTIFY_PIPELINED``), rotating
    the order each round, in the same run. A sampler reads pg_stat_activity every 5 ms: the wait
    events of the clients' backends show what serialises them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("WEFT_BENCH_PEER_PREFIX", "weft_bulk_")

from benchmarks.peer_apps import common
from benchmarks.peers import _fmt, _ratio, machine, table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _setup() -> None:
    os.environ["WEFT_BENCH_PG_NAME"] = common.DATABASES["weft"]
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ.setdefault("WEFT_BENCH_OVERRIDES", json.dumps({"POLL_INTERVAL": "1s"}))
    import django

    django.setup()


# ------------------------------------------------------------------------------------------ many


def _profile(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy (the bench venv's) sampling the engine for ``seconds``: collapsed stacks into ``out``."""
    spy = Path(sys.executable).parent / "py-spy"
    command = [str(spy), "record", "-p", str(pid), "-d", str(seconds), "-r", "50", "-f", "raw", "-o", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarise_profile(path: Path, top: int = 14) -> list[str]:
    """Where the engine's busy threads are, from a py-spy raw profile: each sample goes to the deepest
    weft_django frame of its stack (that function and what it calls in Django, psycopg, the stdlib)."""
    where: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        ours = [frame for frame in stack.split(";") if "weft_django/" in frame and "__main__" not in frame]
        total += int(count)
        where[ours[-1] if ours else "(outside weft_django)"] += int(count)
    return [f"{n * 100 / total:5.1f}%  {frame[:110]}" for frame, n in where.most_common(top)] if total else []


def weft_many(
    n: int,
    stamp: str,
    profile: bool = False,
    concurrency: int = 8,
    loop: bool = False,
    engines: int = 1,
    processes: int = 1,
    steps: str = "regular",
    weft_settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    import weft_django as weft
    from benchmarks.benchapp.workflows import three_local, three_noop
    from benchmarks.peer_apps.weft_bench import Engine, _completed, settle

    workflow = three_local if steps == "local" else three_noop
    name = "bench.three_local" if steps == "local" else "bench.three_noop"
    label = "loop" if loop else f"many{engines}" + (f"x{processes}" if processes > 1 else "")
    label += "".join(f"-{key.lower()}" for key in weft_settings or {})
    logs = {k: RESULTS / f"{stamp}-bulk-engine-{label}-{k}.log" for k in range(2, engines + 1)}
    others = [Engine(f"bulk-{k}", concurrency, log) for k, log in logs.items()]
    engine = Engine(
        "bulk-1", concurrency, RESULTS / f"{stamp}-bulk-engine-{label}.log", processes=processes, weft=weft_settings
    )
    try:
        for other in others:
            other.wait_ready()
        engine.wait_ready()
        weft.start_many([weft.StartRequest(workflow, args=[i]) for i in range(20)])  # warm-up
        common.wait_until(lambda: _completed(name) >= 20, 60, what="warm-up")
        settle()
        before, cpu0 = common.db_counters(common.DATABASES["weft"]), _cpu([engine, *others])
        base = _completed(name)
        sampler = Sampler(clients_only=False)
        sampler.start()
        t0 = time.perf_counter()
        if loop:  # the comparison: one weft.start() per workflow, back to back
            handles = [weft.start(workflow, args=[i]) for i in range(n)]
        else:
            handles = weft.start_many([weft.StartRequest(workflow, args=[i]) for i in range(n)])
        t_started = time.perf_counter()
        spy = _profile(engine.process.pid, 15, RESULTS / f"{stamp}-bulk-engine.pyspy") if profile else None
        assert all(isinstance(h, weft.WorkflowHandle) for h in handles)
        deadline = time.monotonic() + 600
        while _completed(name) - base < n:
            if time.monotonic() > deadline:
                raise TimeoutError("weft: not all completed within 600 s")
            time.sleep(0.02)
        t_end = time.perf_counter()
        cpu1 = _cpu([engine, *others])
        sampler.stop.set()
        sampler.join()
        if spy is not None:
            spy.wait(60)
        settle()
        d = common.delta(before, common.db_counters(common.DATABASES["weft"]))
    finally:
        for running in (engine, *others):
            running.stop()
    out: dict[str, Any] = dict(common.throughput_summary(n, t_started - t0, t_end - t0))
    out["engines"] = engines * processes
    out["processes_per_command"] = processes
    out["engine_cpu_ms_per_workflow"] = ((cpu1 or 0) - (cpu0 or 0)) * 1000 / n
    out["db_commits_per_workflow"] = d["xact_commit"] / n
    out["engine_log"] = str(engine.log_path)
    out["backend_states"] = sampler.shares()
    if profile:
        out["engine_profile"] = summarise_profile(RESULTS / f"{stamp}-bulk-engine.pyspy")
    return out


def _cpu(engines: list[Any]) -> float | None:
    seconds = [engine.cpu() for engine in engines]
    return None if any(second is None for second in seconds) else sum(seconds)


def _subprocess(command: list[str], out: Path) -> dict[str, Any]:
    print("$", " ".join(command), flush=True)
    code = subprocess.run(command, cwd=ROOT).returncode
    if code or not out.exists():
        return {"error": f"exit code {code}"}
    return dict(json.loads(out.read_text()))


def dbos_many(n: int, stamp: str) -> dict[str, Any]:
    out = RESULTS / f"{stamp}-bulk-dbos.json"
    command = [sys.executable, "-m", "benchmarks.peer_apps.dbos_bench", "--out", str(out), "--workflows", str(n)]
    return _subprocess([*command, "--latency", "1", "--signals", "1", "--no-progress"], out)


def raw_many(n: int, stamp: str, steps: str = "regular") -> dict[str, Any]:
    out = RESULTS / f"{stamp}-bulk-raw.json"
    command = [sys.executable, "-m", "benchmarks.raw_sql", "--workflows", str(n), "--batches", "100"]
    command += ["--pattern", steps]
    return _subprocess([*command, "--json", str(out)], out)


def report_many(
    n: int,
    steps: str,
    weft: dict[str, Any],
    dbos: dict[str, Any],
    raw: dict[str, Any],
    loop: dict[str, Any],
    two: dict[str, Any] | None = None,
    processes: dict[str, Any] | None = None,
    serial: dict[str, Any] | None = None,
    python_switch: dict[str, Any] | None = None,
) -> str:
    w = weft.get("workflows_per_s")
    rows = [["weft_django start_many, one engine", _fmt(w), _fmt(weft.get("starts_per_s"), 0), "1.00x"]]
    others = (
        ("weft_django start_many, two engines", two),
        ("weft_django start_many, one weft_engine --processes 2", processes),
        ("weft_django start() loop, one engine", loop),
        ("weft_django start_many, one engine, CLAIM_AHEAD off", serial),
        ("weft_django start_many, one engine, ENGINE_SWITCH_INTERVAL None (Python's 5 ms)", python_switch),
    )
    for label, other in others:
        if other:
            rate = other["workflows_per_s"]
            rows.append([label, _fmt(rate), _fmt(other["starts_per_s"], 0), _ratio(rate, w)])
    best = None
    for part, label in (("a", "DBOS start_workflow loop"), ("a_queue", "DBOS queue.enqueue loop")):
        a = dbos.get(part)
        if a:
            best = max(best or 0.0, a["workflows_per_s"])
            rows.append(
                [label, _fmt(a["workflows_per_s"]), _fmt(a["starts_per_s"], 0), _ratio(a["workflows_per_s"], w)]
            )
    ceiling = next((m["workflows_per_s"] for m in raw.get("modes", []) if m["batch"] == 100), None)
    if ceiling:
        pattern = next((m.get("pattern", "regular") for m in raw.get("modes", []) if m["batch"] == 100), "")
        rows.append([f"raw SQL ({pattern}), 100 workflows per transaction", _fmt(ceiling), "", _ratio(ceiling, w)])
    lines = [
        f"many: {n:,} workflows x 3 no-op steps ({steps} activities for weft_django), started at once, run to "
        "completion (one engine / one DBOS process)",
        table(["system", "workflows/s", "starts/s", "peer / weft_django"], rows),
        f"weft_django / best DBOS: {_ratio(w, best)} (goal >= 25x); weft_django / raw-SQL 100-batch ceiling: "
        f"{(w / ceiling * 100) if w and ceiling else float('nan'):.0f}% (goal >= 80%)",
        *(
            f"{label}: {_ratio(other['workflows_per_s'], best)} best DBOS, "
            f"{other['workflows_per_s'] / ceiling * 100:.0f}% of the ceiling"
            for label, other in (("two engines", two), ("weft_engine --processes 2", processes))
            if other and other.get("workflows_per_s") and best and ceiling
        ),
        f"weft_django engine CPU {_fmt(weft.get('engine_cpu_ms_per_workflow'), 3)} ms/workflow, "
        f"{_fmt(weft.get('db_commits_per_workflow'), 3)} commits/workflow (whole database)",
        f"weft_django backends while running (sampled, all sessions): {weft.get('backend_states')}",
    ]
    if weft.get("engine_profile"):
        lines += [
            "weft_django engine, py-spy (share of busy-thread samples by deepest weft_django frame):",
            *weft["engine_profile"],
        ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ concurrent


def _set_mode(mode: str) -> None:
    from weft_django.store import runs

    runs.NOTIFY_AFTER_COMMIT = mode in ("after", "pipelined")
    runs.NOTIFY_PIPELINED = mode == "pipelined"


def _client(count: int, mode: str, barrier: Any, times: list[float]) -> None:
    from django.db import connections

    import weft_django as weft
    from benchmarks.benchapp.workflows import three_noop

    _set_mode(mode)
    weft.start(three_noop, args=[0])  # the connection and the prepared statement
    barrier.wait()
    for i in range(count):
        t0 = time.perf_counter()
        weft.start(three_noop, args=[i])
        times.append(time.perf_counter() - t0)
    connections.close_all()


def _process_client(count: int, mode: str, barrier: Any, queue: Any) -> None:
    _setup()
    times: list[float] = []
    _client(count, mode, barrier, times)
    queue.put(times)


class Sampler(threading.Thread):
    """pg_stat_activity every 5 ms: wait events of the active backends (not this sampler's); with
    ``clients_only`` off, every backend of the database by application and state (idle: waiting for
    its client, i.e. the engine's Python)."""

    def __init__(self, clients_only: bool = True) -> None:
        super().__init__(daemon=True)
        self.clients_only = clients_only
        self.stop = threading.Event()
        self.events: Counter[str] = Counter()
        self.samples = 0

    def run(self) -> None:
        import psycopg

        with psycopg.connect(common.conninfo(common.DATABASES["weft"]), autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'"
                ).fetchall()
                self.samples += 1
                for state, kind, event in rows:
                    if state == "active":
                        self.events[f"{kind}:{event}" if kind else "CPU (running)"] += 1
                    elif not self.clients_only:
                        self.events[str(state)] += 1
                time.sleep(0.005)

    def shares(self, top: int = 6) -> str:
        total = sum(self.events.values()) or 1
        return ", ".join(f"{k} {v * 100 / total:.0f}%" for k, v in self.events.most_common(top))


def concurrent_config(clients: int, processes: bool, per_client: int, mode: str) -> dict[str, Any]:
    sampler = Sampler()
    times: list[float] = []
    if processes:
        ctx = multiprocessing.get_context("spawn")
        barrier, queue = ctx.Barrier(clients + 1), ctx.Queue()
        workers = [ctx.Process(target=_process_client, args=(per_client, mode, barrier, queue)) for _ in range(clients)]
        for p in workers:
            p.start()
        barrier.wait()
        sampler.start()
        t0 = time.perf_counter()
        for _ in workers:
            times += queue.get(timeout=600)
        wall = time.perf_counter() - t0
        for p in workers:
            p.join(60)
    else:
        tbarrier = threading.Barrier(clients + 1)
        lists: list[list[float]] = [[] for _ in range(clients)]
        threads = [
            threading.Thread(target=_client, args=(per_client, mode, tbarrier, lists[i])) for i in range(clients)
        ]
        for t in threads:
            t.start()
        tbarrier.wait()
        sampler.start()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        times = [x for chunk in lists for x in chunk]
    sampler.stop.set()
    sampler.join()
    return {
        "clients": f"{clients} {'processes' if processes else 'threads'}",
        "mode": mode,
        "starts": len(times),
        "starts_per_s": len(times) / wall,
        "p50_ms": common.percentile(times, 0.5) * 1000,
        "p99_ms": common.percentile(times, 0.99) * 1000,
        "waits": sampler.shares(4),
    }


def concurrent(per_client: int, rounds: int) -> list[dict[str, Any]]:
    results = []
    for clients, processes in ((1, False), (4, False), (16, False), (4, True)):
        for r in range(rounds):
            modes = ("before", "after", "pipelined")
            for mode in modes[r % 3 :] + modes[: r % 3]:
                result = concurrent_config(clients, processes, per_client, mode)
                print(result, flush=True)
                results.append(result)
    return results


def report_concurrent(results: list[dict[str, Any]]) -> str:
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        grouped.setdefault((r["clients"], r["mode"]), []).append(r)
    rows = []
    for (clients, mode), rs in grouped.items():
        rows.append(
            [
                clients,
                mode,
                str(sum(r["starts"] for r in rs)),
                _fmt(statistics.median(r["starts_per_s"] for r in rs), 0),
                _fmt(statistics.median(r["p50_ms"] for r in rs), 2),
                _fmt(statistics.median(r["p99_ms"] for r in rs), 2),
                rs[0]["waits"],
            ]
        )
    return "\n".join(
        [
            "concurrent weft.start() (no engine; median of rounds; waits: what the clients' backends were doing)",
            table(["clients", "NOTIFY", "starts", "starts/s", "p50 ms", "p99 ms", "backend waits (sampled)"], rows),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflows", type=int, default=10_000)
    parser.add_argument("--parts", default="many,concurrent")
    parser.add_argument(
        "--systems",
        default="weft,loop,dbos,raw",
        help="many: which (loop: weft start() loop; weft2: two engines; weftp2: weft_engine --processes 2; "
        "weft_serial: one engine with CLAIM_AHEAD off; weft_pyswitch: one engine with ENGINE_SWITCH_INTERVAL None)",
    )
    parser.add_argument("--steps", choices=("regular", "local"), default="regular", help="many: weft's activities")
    parser.add_argument("--per-client", type=int, default=400, help="concurrent: starts per client")
    parser.add_argument("--rounds", type=int, default=2, help="concurrent: rounds (the three modes rotate)")
    parser.add_argument("--engine-concurrency", type=int, default=8, help="many: weft_engine --concurrency")
    parser.add_argument("--profile", action="store_true", help="many: py-spy the engine for 15 s")
    parser.add_argument("--json", help="write the results here")
    options = parser.parse_args(argv)
    parts, systems = options.parts.split(","), options.systems.split(",")
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    common.recreate_database(common.DATABASES["weft"])
    _setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    meta = machine()
    found: dict[str, Any] = {"machine": meta, "command": " ".join(sys.argv)}
    lines = [f"date {meta['date']}; {meta['nproc']} CPUs; PostgreSQL {meta['postgresql']}; code {meta['git']}"]
    if "many" in parts:
        n, steps = options.workflows, options.steps
        load: dict[str, float] = {}
        runners = {
            "weft": lambda: weft_many(n, stamp, options.profile, options.engine_concurrency, steps=steps),
            "weft_loop": lambda: weft_many(n, stamp, concurrency=options.engine_concurrency, loop=True, steps=steps),
            "weft2": lambda: weft_many(n, stamp, concurrency=options.engine_concurrency, engines=2, steps=steps),
            "weftp2": lambda: weft_many(n, stamp, concurrency=options.engine_concurrency, processes=2, steps=steps),
            "weft_serial": lambda: weft_many(
                n, stamp, concurrency=options.engine_concurrency, steps=steps, weft_settings={"CLAIM_AHEAD": False}
            ),
            "weft_pyswitch": lambda: weft_many(
                n,
                stamp,
                concurrency=options.engine_concurrency,
                steps=steps,
                weft_settings={"ENGINE_SWITCH_INTERVAL": None},
            ),
            "raw": lambda: raw_many(n, stamp, steps),
            "dbos": lambda: dbos_many(n, stamp),
        }
        for name, runner in runners.items():
            found[name] = {}
            if {"weft_loop": "loop"}.get(name, name) in systems:
                load[name] = os.getloadavg()[0]
                found[name] = runner()
                print(name, found[name], flush=True)
        found["load_before"] = load
        lines += [
            "",
            report_many(
                n,
                steps,
                found["weft"],
                found["dbos"],
                found["raw"],
                found["weft_loop"],
                found["weft2"],
                found["weftp2"],
                found["weft_serial"],
                found["weft_pyswitch"],
            ),
        ]
        lines.append("load average (1 min) before each: " + ", ".join(f"{k} {v:.1f}" for k, v in load.items()))
    if "concurrent" in parts:
        found["concurrent"] = concurrent(options.per_client, options.rounds)
        lines += ["", report_concurrent(found["concurrent"])]
    text = "\n".join(lines)
    print(text)
    found["report"] = text
    out = Path(options.json) if options.json else RESULTS / f"{stamp}-bulk-starts.json"
    out.write_text(json.dumps(found, indent=1, default=str))
    print(f"written: {out}")
    common.drop_database(common.DATABASES["weft"])


if __name__ == "__main__":
    main()
