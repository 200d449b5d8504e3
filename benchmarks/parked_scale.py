"""Many parked workflows held by two engines (issue 16, item 4).

    PYTHONPATH=$PWD python -m benchmarks.parked_scale --parked 100000 [--resident 5000] [--signals 200]
        [--ttl 120s --renew 20s] [--batch 500] [--spread 60]

Database ``<WEFT_BENCH_PEER_PREFIX>parked`` (dropped, re-created, migrated). Phase 1, the empty database:
two engines (``WEFT["MAX_RESIDENT_WORKFLOWS"]`` = ``--resident``), ``--signals`` ``bench.parked``
workflows started, parked, then signalled one at a time (signal -> result). Phase 2: N parked
workflows are bulk-inserted by SQL (clones of one real ``weft.start(bench.parked)`` run: its workflow
and unheld claim rows, new ids, run ids and epochs), the engines claim, load, park and evict them;
then the same signal -> result measurement on ``--signals`` of them (``--spread``: sent over that many
seconds, not back to back; before the timed renewal below). Reported: the time to hold all
N, each engine's RSS (VmRSS) and CPU, the renewal (one ``store.claims.renew`` of engine 1's claims,
timed from here: the statement the renewal thread runs; it only extends them), the claim table's HOT
share of updates over an idle window, and the signal -> result p50/p99 at N against the empty database.
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

ROOT = Path(__file__).resolve().parents[1]
DBNAME = os.environ.get("WEFT_BENCH_PEER_PREFIX", "weft_peer_") + "parked"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_engines(count: int, overrides: dict[str, Any], log_dir: Path, tag: str) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, WEFT_BENCH_OVERRIDES=json.dumps(overrides))
    procs = []
    for i in range(count):
        command = [sys.executable, "-m", "django", "weft_engine", "--engine-id", f"{tag}-{i + 1}", "-v", "1"]
        log = (log_dir / f"{tag}-{i + 1}.log").open("w")
        procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()


def held(engine_ids: list[str]) -> int:
    from weft_django.models import WorkflowClaim

    return WorkflowClaim.objects.filter(engine_id__in=engine_ids).count()


def signal_latency(ids: list[str], spread: float = 0.0) -> dict[str, Any]:
    """Signal each workflow and wait for its result, one at a time: back to back, or with ``spread``
    seconds between the first and the last start (evenly: a window as long as a renew interval
    samples the engines' renewals as often as they run, not by the luck of one short window)."""
    import weft_django as weft

    times = []
    began, step = time.perf_counter(), spread / max(1, len(ids) - 1)
    for i, wid in enumerate(ids):
        handle = weft.get_handle(wid)
        time.sleep(max(0.0, began + i * step - time.perf_counter()))
        t0 = time.perf_counter()
        handle.signal("go", i)
        value = handle.result(timeout=60)
        times.append(time.perf_counter() - t0)
        assert value[1] == i, value
    summary = common.latency_summary(times)
    return {**summary, "worst_ms": [round(t * 1000, 2) for t in sorted(times)[-5:]]}  # the tail's shape


def clone_parked(template: str, n: int) -> float:
    """Insert n copies of the template run's workflow and unheld-claim rows; returns seconds."""
    from django.db import connection

    from weft_django.models import Workflow, WorkflowClaim
    from weft_django.store.epochs import SEQUENCE

    wf, claim = Workflow._meta.db_table, WorkflowClaim._meta.db_table
    began = time.monotonic()
    with connection.cursor() as cursor:
        for table, key in ((wf, "id"), (claim, "workflow_id")):
            cursor.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
                [table],
            )
            columns = [row[0] for row in cursor.fetchall()]
            exprs = []
            for c in columns:
                if c == key:
                    exprs.append("'pk-' || g")
                elif c == "run_id":
                    exprs.append("gen_random_uuid()")
                elif c == "epoch":
                    exprs.append(f"nextval('{SEQUENCE}')")
                else:
                    exprs.append(f"t.{c}")
            step = 100_000
            for lo in range(0, n, step):
                cursor.execute(
                    f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(exprs)} "
                    f"FROM {table} t, generate_series(%s, %s) g WHERE t.{key} = %s",
                    [lo, min(n, lo + step) - 1, template],
                )
        cursor.execute(f"ANALYZE {wf}")
        cursor.execute(f"ANALYZE {claim}")
    return time.monotonic() - began


def claim_updates() -> tuple[int, int]:
    from django.db import connection

    from weft_django.models import WorkflowClaim

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s",
            [WorkflowClaim._meta.db_table],
        )
        upd, hot = cursor.fetchone()
    return int(upd), int(hot)


def timed_renewal(engine_id: str, ttl_seconds: float) -> dict[str, float]:
    from datetime import timedelta

    from weft_django.models import WorkflowClaim
    from weft_django.store import claims

    owned = dict(WorkflowClaim.objects.filter(engine_id=engine_id).values_list("workflow_id", "epoch"))
    t0 = time.perf_counter()
    lost = claims.renew(engine_id, owned, timedelta(seconds=ttl_seconds), "default")
    return {"claims": len(owned), "seconds": time.perf_counter() - t0, "lost": len(lost)}


def timed_takeover_scans(ttl_seconds: float, renew_seconds: float) -> dict[str, float]:
    """The takeover scan as the claimer runs it, timed from here: the full one (every held claim) and
    the frequent one (the claims of silent engines; here an engine id that holds none), with the
    engines' own TTL and grace (a shorter TTL would judge their dormant claims by a heartbeat they
    write only once per renew interval). Nothing has lapsed, so neither takes anything."""
    from datetime import timedelta

    from weft_django.store import claims
    from weft_django.store.claims.lapse import takeover_grace

    out = {}
    for name, holders in (("full", None), ("silent_only", ["no-such-engine"])):
        t0 = time.perf_counter()
        got = claims.acquire(
            "scan-probe",
            limit=500,
            ttl=timedelta(seconds=ttl_seconds),
            using="default",
            grace=takeover_grace(timedelta(seconds=renew_seconds)),
            holders=holders,
        )
        out[f"{name}_seconds"] = time.perf_counter() - t0
        assert not got, got
    return out


def phase(label: str, ids: list[str], engine_ids: list[str], procs: list[Any], args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"label": label, "held": held(engine_ids)}
    settle = 3.0
    time.sleep(settle)
    cpu0 = [common.proc_cpu_seconds(p.pid) or 0.0 for p in procs]
    upd0 = claim_updates()
    time.sleep(args.idle)
    cpu1 = [common.proc_cpu_seconds(p.pid) or 0.0 for p in procs]
    time.sleep(1.5)  # statistics flush
    upd1 = claim_updates()
    out["rss_mb"] = [round(rss_mb(p.pid), 1) for p in procs]
    out["idle_cpu_pct"] = [round((b - a) * 100 / args.idle, 1) for a, b in zip(cpu0, cpu1, strict=True)]
    out["claim_updates_idle"] = upd1[0] - upd0[0]
    out["claim_hot_updates_idle"] = upd1[1] - upd0[1]
    # The signals first: the timed renewal below writes every claim of engine 1 at once, and its WAL,
    # dirty pages and the autovacuum it sets off would otherwise fall on the signals that follow.
    out["signal"] = signal_latency(ids, args.spread)
    out["renewal"] = timed_renewal(engine_ids[0], args.ttl_seconds)
    out["takeover_scan"] = timed_takeover_scans(args.ttl_seconds, args.renew_seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parked", type=int, default=100_000)
    parser.add_argument("--resident", type=int, default=5000, help="MAX_RESIDENT_WORKFLOWS per engine")
    parser.add_argument("--signals", type=int, default=200)
    parser.add_argument("--batch", type=int, default=500, help="CLAIM_BATCH_SIZE")
    parser.add_argument("--ttl", default="120s", help="WORKFLOW_CLAIM_TTL")
    parser.add_argument("--renew", default="20s", help="WORKFLOW_CLAIM_RENEW_INTERVAL")
    parser.add_argument("--idle", type=float, default=30.0, help="idle window measured (seconds)")
    parser.add_argument(
        "--spread", type=float, default=0.0, help="seconds over which the signals are sent (0: back to back)"
    )
    parser.add_argument("--hold-timeout", type=float, default=900.0)
    args = parser.parse_args()
    from weft_django.durations import to_ms

    args.ttl_seconds = to_ms(args.ttl) / 1000
    args.renew_seconds = to_ms(args.renew) / 1000
    os.environ["WEFT_BENCH_PG_NAME"] = DBNAME
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    common.recreate_database(DBNAME)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import weft_django as weft
    from benchmarks.benchapp.workflows import parked

    overrides = {
        "POLL_INTERVAL": "1s",
        "MAX_RESIDENT_WORKFLOWS": args.resident,
        "CLAIM_BATCH_SIZE": args.batch,
        "WORKFLOW_CLAIM_TTL": args.ttl,
        "WORKFLOW_CLAIM_RENEW_INTERVAL": args.renew,
    }
    log_dir = ROOT / "benchmarks" / "results"
    log_dir.mkdir(exist_ok=True)
    engine_ids = ["parked-1", "parked-2"]
    result: dict[str, Any] = {"parked": args.parked, "settings": overrides}
    procs = start_engines(2, overrides, log_dir, "parked")
    try:
        common.wait_until(lambda: held(engine_ids) >= 0, 5)
        small = [weft.start(parked, args=[i], id=f"empty-{i}").id for i in range(args.signals)]
        common.wait_until(lambda: held(engine_ids) >= len(small), 120, what="empty-db workflows held")
        result["empty"] = phase("empty database", small, engine_ids, procs, args)
        print(json.dumps(result["empty"], indent=1), flush=True)
        template = weft.start(parked, args=[0], id="pk-template").id
        common.wait_until(lambda: held(engine_ids) >= 1, 60)
        stop(procs)  # the clones copy the template's unheld claim: clone while no engine runs
        from weft_django.models import WorkflowClaim

        WorkflowClaim.objects.filter(workflow_id=template).update(engine_id=None)
        result["insert_seconds"] = clone_parked(template, args.parked)
        print(f"inserted {args.parked} parked workflows in {result['insert_seconds']:.1f} s", flush=True)
        procs = start_engines(2, overrides, log_dir, "parked-n")
        engine_ids = ["parked-n-1", "parked-n-2"]
        began = time.monotonic()
        try:
            common.wait_until(
                lambda: held(engine_ids) >= args.parked, args.hold_timeout, interval=5.0, what="all parked held"
            )
        except Exception:  # not all held in time: measure what is (the table says how many)
            print(f"only {held(engine_ids)} held after {args.hold_timeout:.0f} s", flush=True)
        result["hold_seconds"] = time.monotonic() - began
        print(f"held {held(engine_ids)} in {result['hold_seconds']:.1f} s", flush=True)
        from weft_django.models import WorkflowClaim

        holding = list(
            WorkflowClaim.objects.filter(engine_id__in=engine_ids, workflow_id__startswith="pk-")
            .order_by("?")
            .values_list("workflow_id", flat=True)[: args.signals]
        )
        result["at_n"] = phase(f"{args.parked} parked", holding, engine_ids, procs, args)
    finally:
        stop(procs)
    e, n = result["empty"], result["at_n"]
    print(f"\nparked workflows held by 2 engines; N = {args.parked}, MAX_RESIDENT_WORKFLOWS = {args.resident}")
    print("| | empty database | N parked |\n|---|---|---|")
    print(f"| held | {e['held']} | {n['held']} |")
    print(f"| RSS per engine, MB | {e['rss_mb']} | {n['rss_mb']} |")
    print(f"| idle CPU per engine, % of a core | {e['idle_cpu_pct']} | {n['idle_cpu_pct']} |")
    for k in ("claims", "seconds"):
        print(f"| one renewal of engine 1's claims: {k} | {e['renewal'][k]:.3g} | {n['renewal'][k]:.3g} |")
    for k in ("full_seconds", "silent_only_seconds"):
        print(f"| takeover scan, {k} | {e['takeover_scan'][k]:.3g} | {n['takeover_scan'][k]:.3g} |")
    print(
        f"| claim updates in {args.idle:.0f} s idle (HOT) | {e['claim_updates_idle']} ({e['claim_hot_updates_idle']}) "
        f"| {n['claim_updates_idle']} ({n['claim_hot_updates_idle']}) |"
    )
    print(
        f"| signal -> result p50 / p99 ms | {e['signal']['p50_ms']:.1f} / {e['signal']['p99_ms']:.1f} "
        f"| {n['signal']['p50_ms']:.1f} / {n['signal']['p99_ms']:.1f} |"
    )
    print(f"insert {result['insert_seconds']:.1f} s; engines held all N in {result['hold_seconds']:.1f} s")
    out = log_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-parked-scale.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
