"""run_maintenance(): for hosts with BACKGROUND_TASKS = "manual" (no long-running engine process)."""

from __future__ import annotations


def run_maintenance(engine_id: str | None = None) -> None:
    """One ``weft_engine --once`` pass in this process: claim what is runnable, drive it until nothing is
    runnable now, and release every claim before returning. Call it more often than
    WORKFLOW_CLAIM_RENEW_INTERVAL (a cron job, a Celery beat task)."""
    from .engine import Engine

    Engine(engine_id).run(once=True)
