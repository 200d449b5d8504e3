"""The ``fencing-cost`` scenario of benchmarks/run.py: the throughput (or backlog) run of throughput.py
with OWNERSHIP "workflow-lease" and "none", alternately, and the medians per mode."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from benchmarks.throughput import three_noop_run


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
            r = three_noop_run(
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
