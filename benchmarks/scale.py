"""Scale scenarios of issue 9, registered in benchmarks/run.py:

* ``parked`` (f): ONE engine subprocess holds N parked workflows (half ``bench.parked``, waiting for a
  signal; half ``bench.sleeper``, sleeping 30 days). Measured: the engine's RSS before and after,
  its CPU while idle for ``--idle-seconds``, the database work of that idle window, what one renewal
  of all N claims costs (timed and EXPLAINed), and the SIGTERM shutdown (releasing N claims).
* ``timers`` (g): 0, 10,000 and 100,000 sleeping workflows (one ``sleep`` timer each) held by another
  live engine; an engine in this process ticks beside them. Measured per count: ms and statements per
  tick (poll ticks, and ticks with every periodic chore due), the orphaned-timer sweep, and the plan
  (EXPLAIN ANALYZE, rolled back) of every statement shape a tick and the sweep sent.

Synthetic fixture (both scenarios), so that 100,000 workflows take seconds, not hours: one template
run of each workflow type is made through the public API (``weft.start``; for ``timers`` also parked
by an in-process engine, which writes its ``sleep`` timer), and its rows are copied with
``INSERT ... SELECT ... FROM generate_series`` column for column: a new id (``<prefix><i>``), a new
run id (``md5(id)::uuid``), created_at shifted by i microseconds, the timer's fire_at by i seconds,
and a fresh epoch from the engines' own sequence for each claim. In ``parked`` the claims are
written unheld (exactly as ``weft.start`` writes them) and the engine claims and parks the runs
itself; in ``timers`` they are written held by the engine row ``bench-holder`` (heartbeat now, claims
expiring in a day), as if a live engine had claimed and parked them.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

SLEEP_SECONDS = 30 * 24 * 3600
HOLDER = "bench-holder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parked-workflows", type=int, default=10000, help="parked: workflows held (default 10000)")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="parked: idle window measured (default 60)")
    parser.add_argument(
        "--timer-counts",
        default="0,10000,100000",
        help="timers: sleeping-timer counts, cumulative (default 0,10000,100000)",
    )
    parser.add_argument("--ticks", type=int, default=30, help="timers: ticks measured per count (default 30)")


# ------------------------------------------------------------------------------------------ fixture


def _columns(table: str) -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
            [table],
        )
        return [row[0] for row in cursor.fetchall()]


def _clone(
    table: str, overrides: dict[str, str], where: str, params: list[Any], n: int, skip: tuple[str, ...] = ()
) -> int:
    """INSERT ... SELECT the template rows ``where`` of ``table`` once per i in 1..n, with ``overrides``
    (SQL expressions over the template row ``t`` and ``i``; ``:id`` is the new workflow id)."""
    from django.db import connection

    columns = [c for c in _columns(table) if c not in skip]
    exprs = [overrides.get(c, f"t.{c}") for c in columns]
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(exprs)} "
        f"FROM {table} t CROSS JOIN generate_series(1, %s) AS g(i) WHERE {where}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [n, *params])  # generate_series comes before WHERE
        return cursor.rowcount


def clone_runs(template: str, prefix: str, n: int, *, holder: str | None, first: int = 1) -> None:
    """Copy the template run ``template`` n times as ``<prefix><first..first+n-1>`` (see the module
    docstring). With ``holder``, the claims are held by it and expire in a day; else unheld."""
    from django.db import connection, transaction

    new_id = f"('{prefix}' || (i + {first - 1}))"
    run_id = f"md5{new_id}::uuid"
    with transaction.atomic():
        _clone(
            "weft_django_workflow",
            {"id": new_id, "run_id": run_id, "created_at": "t.created_at + i * interval '1 microsecond'"},
            "t.id = %s",
            [template],
            n,
        )
        held = (
            {
                "engine_id": "%s",
                "claimed_at": "clock_timestamp()",
                "expires_at": "clock_timestamp() + interval '1 day'",
            }
            if holder
            else {"engine_id": "NULL", "claimed_at": "NULL", "expires_at": "NULL"}
        )
        columns = _columns("weft_django_workflowclaim")
        exprs = {"workflow_id": new_id, "epoch": "nextval('weft_django_epoch_seq')", **held}
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO weft_django_workflowclaim ({', '.join(columns)}) "
                f"SELECT {', '.join(exprs.get(c, 't.' + c) for c in columns)} "
                f"FROM weft_django_workflowclaim t CROSS JOIN generate_series(1, %s) AS g(i) WHERE t.workflow_id = %s",
                ([holder] if holder else []) + [n, template],
            )
        for table in ("weft_django_step", "weft_django_timer"):
            shifted = {"fire_at": "t.fire_at + i * interval '1 second'"} if table == "weft_django_timer" else {}
            _clone(
                table,
                {"workflow_id": new_id, "run_id": run_id, **shifted},
                "t.workflow_id = %s",
                [template],
                n,
                ("id",),
            )


def _counts() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        out = {}
        for table in ("workflow", "workflowclaim", "step", "timer"):
            cursor.execute(f"SELECT count(*) FROM weft_django_{table}")
            out[table] = cursor.fetchone()[0]
    return out


def _analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _rss_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


# ------------------------------------------------------------------------------------------ explain


_SKIP = re.compile(r"^\s*(SAVEPOINT|RELEASE|ROLLBACK|LISTEN|SET|BEGIN|COMMIT)\b", re.I)


class Capture:
    """Records (sql, params) of the statements run on this thread (a Django execute wrapper)."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[str, Any]] = {}

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        from benchmarks.sqltrace import normalise

        if not many and not _SKIP.match(sql):
            self.seen.setdefault(normalise(sql), (sql, params))
        return execute(sql, params, many, context)


def _walk(node: dict[str, Any], nodes: list[str], seq: list[str]) -> int:
    """Describe the plan's relation scans into ``nodes`` (seq scans into ``seq``); return the rows
    they visited (returned + removed by a filter, over all loops)."""
    kind = node["Node Type"]
    rel, index = node.get("Relation Name"), node.get("Index Name")
    loops = node.get("Actual Loops", 1)
    rows, removed = node.get("Actual Rows", 0) * loops, node.get("Rows Removed by Filter", 0) * loops
    visited = 0
    if rel:
        visited = rows + removed
        nodes.append(f"{kind} {index + ' on ' if index else ''}{rel} rows={rows} removed={removed}")
        if kind == "Seq Scan":
            seq.append(rel)
    elif kind == "Limit":
        nodes.append("Limit")
    for child in node.get("Plans", []):
        visited += _walk(child, nodes, seq)
    return visited


def explain_all(statements: dict[str, tuple[str, Any]]) -> list[dict[str, Any]]:
    """EXPLAIN (ANALYZE, BUFFERS) each statement in a transaction that is rolled back."""
    from django.db import connection, transaction

    plans = []
    for shape, (sql, params) in statements.items():
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
                    doc = cursor.fetchone()[0]
                    cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
                    text = "\n".join(r[0] for r in cursor.fetchall())
                transaction.set_rollback(True)
        except Exception as exc:  # e.g. a statement whose parameters only make sense once
            plans.append({"sql": shape, "error": str(exc)})
            continue
        plan = (doc if isinstance(doc, list) else json.loads(doc))[0]
        nodes: list[str] = []
        seq: list[str] = []
        visited = _walk(plan["Plan"], nodes, seq)
        plans.append(
            {
                "sql": shape,
                "ms": plan.get("Execution Time"),
                "shared_blocks": plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0),
                "rows_visited": visited,
                "seq_scans": seq,
                "nodes": nodes,
                "plan": text,
            }
        )
    return plans


# ------------------------------------------------------------------------------------------ parked (f)


def scenario_parked(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    from django.db import connection
    from django.db.models import Count

    import weft_django as weft
    from benchmarks import harness as base
    from benchmarks.benchapp.workflows import parked, sleeper
    from weft_django.engine import ownership
    from weft_django.models import Timer, WorkflowClaim
    from weft_django.store.notify import send

    n = options.parked_workflows
    half = n // 2
    base.RESULTS.mkdir(exist_ok=True)
    log = base.RESULTS / f"{stamp}-parked-engine.log"
    trace_out = base.RESULTS / f"{stamp}-parked-engine-sql.json" if options.trace_sql else None
    engine = base.EngineProcess(
        "bench-1", options.engine_concurrency, options.engine_verbosity, trace_out, log, options.weft
    )
    result: dict[str, Any] = {
        "scenario": "parked",
        "workflows": n,
        "engine_log": str(log),
        "weft_overrides": options.weft,
    }
    try:
        engine.wait_ready()
        time.sleep(2.0)
        result["rss_kb_empty"] = _rss_kb(engine.process.pid)
        cpu0, t0 = engine.cpu_seconds(), time.monotonic()
        time.sleep(10.0)
        result["idle_cpu_pct_empty"] = 100 * (engine.cpu_seconds() - cpu0) / (time.monotonic() - t0)

        print(f"parked: bulk-creating {n} runs (clones of two weft.start templates) ...", flush=True)
        weft.start(parked, args=[0], id="p-0")
        weft.start(sleeper, args=[0, SLEEP_SECONDS], id="s-0")
        clone_start = time.monotonic()
        clone_runs("p-0", "p-", n - half - 1, holder=None)
        clone_runs("s-0", "s-", half - 1, holder=None)
        _analyze()
        with connection.cursor():
            send("w", "*", "default")  # autocommit: the engine rescans at once
        result["fixture_seconds"] = time.monotonic() - clone_start
        clock0, cpu0 = time.monotonic(), engine.cpu_seconds()
        while True:
            held = WorkflowClaim.objects.filter(engine_id=engine.engine_id).count()
            timers = Timer.objects.filter(kind="sleep").count()
            if held >= n and timers >= half:
                break
            if not engine.alive():
                raise RuntimeError(f"engine exited:\n{engine.tail()}")
            if time.monotonic() - clock0 > 900:
                raise RuntimeError(f"not parked after 900 s: {held} held, {timers} timers\n{engine.tail()}")
            time.sleep(0.5)
        result["park_seconds"] = time.monotonic() - clock0
        result["park_cpu_seconds"] = engine.cpu_seconds() - cpu0
        time.sleep(5.0)  # the last batch's commit settles

        base.settle_stats()
        before = base.db_counters()
        rss_before = _rss_kb(engine.process.pid)
        cpu0, t0 = engine.cpu_seconds(), time.monotonic()
        print(f"parked: idling {options.idle_seconds:.0f} s with {n} parked ...", flush=True)
        time.sleep(options.idle_seconds)
        idle = time.monotonic() - t0
        idle_cpu = engine.cpu_seconds() - cpu0
        result["rss_kb_parked"] = _rss_kb(engine.process.pid)
        result["rss_kb_parked_before_idle"] = rss_before
        base.settle_stats()
        delta = base.counter_delta(before, base.db_counters())
        result["idle_seconds"] = idle
        result["idle_cpu_pct"] = 100 * idle_cpu / idle
        result["idle_db"] = delta
        result["idle_commits_per_s"] = (delta["xact_commit"] - base.STATS_READ_TRANSACTIONS) / idle
        result["idle_rows_read_per_s"] = (delta["tup_returned"] + delta["tup_fetched"]) / idle

        # One renewal of all n claims, as the engine's renewal thread sends it (it extends them too).
        epochs = dict(WorkflowClaim.objects.filter(engine_id=engine.engine_id).values_list("workflow_id", "epoch"))
        from weft_django.conf import get_settings

        ttl = get_settings().workflow_claim_ttl
        times = []
        for _ in range(5):
            t = time.perf_counter()
            lost = ownership.renew(engine.engine_id, epochs, ttl, "default")
            times.append((time.perf_counter() - t) * 1000)
        result["renew_ms"] = times
        result["renew_lost"] = len(lost)
        capture = Capture()
        with connection.execute_wrapper(capture):
            ownership.renew(engine.engine_id, epochs, ttl, "default")
        result["renew_plan"] = explain_all(capture.seen)
        result["statuses"] = dict(
            WorkflowClaim.objects.values_list("engine_id").annotate(c=Count("pk")).values_list("engine_id", "c")
        )

        t = time.monotonic()
        code = engine.stop(timeout=120)
        result["shutdown_seconds"] = time.monotonic() - t
        result["engine_exit_code"] = code
        result["released_after_stop"] = WorkflowClaim.objects.filter(engine_id__isnull=True).count()
    finally:
        engine.stop()
    if trace_out is not None and trace_out.exists():
        trace = json.loads(trace_out.read_text())
        result["engine_sql"] = {
            "statements": trace["statements"],
            "by_thread": trace["by_thread"],
            "top_shapes": trace["shapes"][:25],
        }
    return result


def report_parked(r: dict[str, Any]) -> list[str]:
    from benchmarks.harness import table

    e, p = r["rss_kb_empty"], r["rss_kb_parked"]
    growth = (p["VmRSS"] - e["VmRSS"]) / 1024
    d = r["idle_db"]
    claims = d["tables"].get("weft_django_workflowclaim", {})
    rows = [
        (
            "workflows",
            f"{r['workflows']} (half bench.parked waiting for a signal, half bench.sleeper sleeping 30 days)",
        ),
        ("fixture", f"{r['fixture_seconds']:.1f} s bulk clone (unheld claims, as weft.start writes them)"),
        ("engine claims and parks them", f"{r['park_seconds']:.1f} s, {r['park_cpu_seconds']:.1f} s engine CPU"),
        ("engine RSS, no workflows", f"{e['VmRSS'] / 1024:.0f} MB"),
        (
            "engine RSS, all parked",
            f"{p['VmRSS'] / 1024:.0f} MB (peak {p['VmHWM'] / 1024:.0f} MB); "
            f"+{growth:.0f} MB = {growth * 1024 / r['workflows']:.1f} KB per parked workflow",
        ),
        ("idle CPU, no workflows", f"{r['idle_cpu_pct_empty']:.1f} % of one core (10 s)"),
        ("idle CPU, all parked", f"{r['idle_cpu_pct']:.1f} % of one core over {r['idle_seconds']:.0f} s"),
        (
            "idle database work",
            f"{r['idle_commits_per_s']:.1f} commits/s, {r['idle_rows_read_per_s']:.0f} rows read/s, "
            f"claims upd {claims.get('upd', 0)} (hot {claims.get('hot_upd', 0)}) in {r['idle_seconds']:.0f} s",
        ),
        (
            f"one renewal of {r['workflows']} claims",
            f"{statistics.median(r['renew_ms']):.0f} ms median of 5 ({', '.join(f'{v:.0f}' for v in r['renew_ms'])}); "
            f"{r['renew_lost']} lost",
        ),
        ("SIGTERM -> exit (releases all)", f"{r['shutdown_seconds']:.1f} s, exit code {r['engine_exit_code']}"),
    ]
    for plan in r["renew_plan"]:
        if "error" in plan:
            continue
        rows.append(
            (
                "  renew plan",
                f"{plan['ms']:.0f} ms, seq scans {plan['seq_scans'] or 'none'}: {'; '.join(plan['nodes'])}",
            )
        )
    lines = ["", "scenario: parked", table(rows)]
    if "engine_sql" in r:
        lines += ["", "  engine statements by shape (calls, thread, SQL), whole run:"]
        for s in r["engine_sql"]["top_shapes"][:15]:
            lines.append(f"  {s['calls']:>7}  {s['thread']:<12}  {s['sql'][:110]}")
    return lines


# ------------------------------------------------------------------------------------------ timers (g)


def _measure_ticks(engine: Any, ticks: int, poll: float) -> dict[str, Any]:
    """``ticks`` poll ticks (each after a poll interval, so every poll-interval scan runs), then three
    ticks with every periodic chore due. Statements of the loop thread counted by sqltrace."""
    from benchmarks import sqltrace

    def one(force: bool) -> tuple[float, int]:
        if force:
            for task in engine.periodic:
                task.last_run = 0.0
        time.sleep(poll)
        engine._wake.clear()  # as the loop's wait does: a pending wake-up would defer the chores
        before = sqltrace.snapshot()["by_thread"].get("main", {}).get("statements", 0)
        t = time.perf_counter()
        engine.tick()
        ms = (time.perf_counter() - t) * 1000
        return ms, sqltrace.snapshot()["by_thread"].get("main", {}).get("statements", 0) - before

    for _ in range(3):
        one(False)  # warm-up: connection, first scans
    poll_ticks = [one(False) for _ in range(ticks)]
    chore_ticks = [one(True) for _ in range(3)]

    def summary(values: list[tuple[float, int]]) -> dict[str, Any]:
        ms = [v[0] for v in values]
        return {
            "ms_median": statistics.median(ms),
            "ms_p90": sorted(ms)[int(0.9 * (len(ms) - 1))],
            "ms_max": max(ms),
            "statements_median": statistics.median(v[1] for v in values),
        }

    return {"poll_tick": summary(poll_ticks), "tick_with_chores": summary(chore_ticks)}


def scenario_timers(options: argparse.Namespace, stamp: str) -> dict[str, Any]:
    from django.db import connection, connections

    import weft_django as weft
    from benchmarks.benchapp.workflows import sleeper
    from weft_django.engine import sweeps
    from weft_django.engine.engine import Engine as InProcessEngine
    from weft_django.store import engines
    from weft_django.store.clock import db_now

    counts = sorted(int(c) for c in options.timer_counts.split(",") if c.strip())
    poll = 0.1
    # The template: one sleeper started and parked by an engine in this process (which writes its timer).
    weft.start(sleeper, args=[0, SLEEP_SECONDS], id="t-0")
    InProcessEngine("bench-template").run_until_idle(60)
    engines.register_engine(HOLDER, "workflow-lease", "default")
    with connection.cursor() as cursor:  # the template is held by HOLDER too, like its clones
        cursor.execute(
            "UPDATE weft_django_workflowclaim SET engine_id = %s, claimed_at = clock_timestamp(), "
            "expires_at = clock_timestamp() + interval '1 day' WHERE workflow_id = 't-0'",
            [HOLDER],
        )

    def level(count: int, due: str) -> dict[str, Any]:
        from benchmarks import sqltrace

        engines.heartbeat_engine(HOLDER, "default")
        fixture = _counts()
        engine = InProcessEngine("bench-tick")
        engine.start()
        try:
            measured = _measure_ticks(engine, options.ticks, poll)
            # One pass of the orphaned-timer sweep, as the periodic task runs it (5 passes in a row).
            task = next(t for t in engine.periodic if t.name == "timer-sweep")
            sweep_ms, sweep_statements = [], []
            for _ in range(5):
                before = sqltrace.snapshot()["statements"]
                t = time.perf_counter()
                task.run(engine, db_now("default"))
                sweep_ms.append((time.perf_counter() - t) * 1000)
                sweep_statements.append(sqltrace.snapshot()["statements"] - before)
            t = time.perf_counter()
            sweeps.collect_orphaned_timers(engine, db_now("default"))  # a whole cycle, every timer looked at
            cycle_ms = (time.perf_counter() - t) * 1000
            # Every statement shape of a chore tick (every periodic chore and the takeover scan due)
            # and of one sweep pass, EXPLAIN ANALYZEd in a rolled-back transaction.
            capture = Capture()
            with connection.execute_wrapper(capture):
                for chore in engine.periodic:
                    chore.last_run = 0.0
                engine.claimer.last_takeover_scan = 0.0
                time.sleep(poll)
                engine._wake.clear()
                engine.tick()
                task.run(engine, db_now("default"))
            plans = explain_all(capture.seen)
        finally:
            engine.shutdown()
            connections["default"].close()
        return {
            "timers": count,
            "due": due,
            "rows": fixture,
            **measured,
            "sweep_ms_median": statistics.median(sweep_ms),
            "sweep_statements": statistics.median(sweep_statements),
            "sweep_cycle_ms": cycle_ms,
            "plans": plans,
        }

    levels = []
    have = 0
    for count in counts:
        if count > have:
            t = time.monotonic()
            clone_runs("t-0", "t-", count - have, holder=HOLDER, first=have + 1)
            _analyze()
            print(
                f"timers: {count} sleeping workflows held by {HOLDER} ({time.monotonic() - t:.1f} s to clone)",
                flush=True,
            )
            have = count
        levels.append(level(count, "future"))
    if have:
        # The same timers all past due, as when their holder stalls or they belong to suspended runs:
        # the due-work scans must still not walk them.
        with connection.cursor() as cursor:
            cursor.execute("UPDATE weft_django_timer SET fire_at = clock_timestamp() - interval '1 hour'")
        _analyze()
        levels.append(level(have, "past"))
    return {"scenario": "timers", "poll_interval_s": poll, "ticks": options.ticks, "levels": levels}


def report_timers(r: dict[str, Any]) -> list[str]:
    from benchmarks.harness import table

    rows = []
    for lv in r["levels"]:
        p, c = lv["poll_tick"], lv["tick_with_chores"]
        rows.append(
            (
                f"{lv['timers']:>7} timers, {lv['due']}",
                f"poll tick {p['ms_median']:.1f} ms (p90 {p['ms_p90']:.1f}, max {p['ms_max']:.1f}), "
                f"{p['statements_median']:.0f} statements; with all chores {c['ms_median']:.1f} ms, "
                f"{c['statements_median']:.0f} st; "
                f"sweep pass {lv['sweep_ms_median']:.1f} ms, {lv['sweep_statements']:.0f} st "
                f"(whole cycle {lv['sweep_cycle_ms']:.0f} ms)",
            )
        )
    lines = [
        "",
        f"scenario: timers (held by {HOLDER}; engine ticks in-process, {r['ticks']} poll ticks per count)",
        table(rows),
    ]
    for last in r["levels"][-2:]:
        lines += _plan_lines(last)
    return lines


def _plan_lines(last: dict[str, Any]) -> list[str]:
    lines = ["", f"  plans at {last['timers']} timers, {last['due']} (execution ms, rows visited, SQL; scans):"]
    for plan in last["plans"]:
        if "error" in plan:
            lines.append(f"  error: {plan['sql'][:100]}: {plan['error'][:80]}")
            continue
        lines.append(f"  {plan['ms']:8.2f} ms  {plan['rows_visited']:>7} rows  {plan['sql'][:96]}")
        lines.append(f"  {'':22}{'; '.join(plan['nodes'])[:160]}")
    return lines
