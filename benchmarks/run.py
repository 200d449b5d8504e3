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
import sys

from benchmarks import scale
from benchmarks.fencing_cost import scenario_fencing_cost
from benchmarks.harness import RESULTS, ROOT, recreate_database, server_facts
from benchmarks.run_report import machine, report
from benchmarks.takeover import TAKEOVER_CASES, duration_seconds, scenario_takeover
from benchmarks.throughput import scenario_backlog, scenario_throughput

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")


# The scenarios live in throughput.py (throughput, backlog), takeover.py, fencing_cost.py and scale.py
# (parked, timers); the printed table in run_report.py.
SCENARIOS = {
    "throughput": scenario_throughput,
    "backlog": scenario_backlog,
    "takeover": scenario_takeover,
    "fencing-cost": scenario_fencing_cost,
    "parked": scale.scenario_parked,  # issue 9 (f), benchmarks/scale.py
    "timers": scale.scenario_timers,  # issue 9 (g), benchmarks/scale.py
}


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
            duration_seconds(ttl), duration_seconds(renew)
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
