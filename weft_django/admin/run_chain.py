"""The chain of a workflow's runs on its admin page (``ctx.continue_as_new``): each run that continued
as new, with links to see its steps (``?run=<run id>``) and to the run before and after it."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from ..models import ContinuedRun, Workflow

RUNS_SHOWN = 50


def run_chain(request: HttpRequest, workflow: Workflow, using: str) -> dict[str, Any]:
    """The template context of the runs section, and which run's steps the page shows.

    Args:
        request: the change page's request (``?run=`` picks an earlier run of the chain).
        workflow: the workflow shown.
        using: the connection alias.

    Returns:
        ``{"runs": [...], "more_runs", "viewed_run_id", "previous_run_id", "next_run_id"}``: ``runs``
        newest first, the current run first of all; ``viewed_run_id`` the run whose steps to show.
    """
    rows = list(
        ContinuedRun.objects.using(using)
        .filter(workflow_id=workflow.pk)
        .order_by("-finished_at", "-id")
        .values("run_id", "next_run_id", "steps", "started_at", "finished_at")[: RUNS_SHOWN + 1]
    )
    current = str(workflow.run_id)
    if not rows:
        return {"runs": [], "viewed_run_id": current}
    runs = [{"run_id": current, "current": True, "started_at": workflow.started_at}]
    runs += [{**row, "run_id": str(row["run_id"]), "next_run_id": str(row["next_run_id"])} for row in rows]
    wanted = request.GET.get("run") or current
    viewed = next((run for run in runs[: RUNS_SHOWN + 1] if run["run_id"] == wanted), runs[0])
    by_next = {run.get("next_run_id"): run["run_id"] for run in runs}
    for run in runs:
        run["viewed"] = run is viewed
    return {
        "runs": runs[: RUNS_SHOWN + 1],
        "more_runs": len(rows) > RUNS_SHOWN,
        "viewed_run_id": viewed["run_id"],
        "previous_run_id": by_next.get(viewed["run_id"]),
        "next_run_id": viewed.get("next_run_id"),
    }
