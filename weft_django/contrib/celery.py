"""Celery integration (``pip install 'weft-django[celery]'``). See docs/celery.md.

- Activities on a worker fleet: with ``WEFT["ACTIVITY_EXECUTOR"] = "celery"``, or
  ``@weft.activity(executor="celery", queue="...")`` for one activity, the engine sends each attempt as
  the task ``weft_django.run_activity`` carrying (workflow id, run id, seq, attempt, epoch, activity
  name, arguments). A worker runs it and commits its outcome fenced by the epoch (engine/remote.py):
  a redelivery, a duplicate or a stale epoch is refused and logged, never recorded twice. The engine
  learns of outcomes from the ``w:<workflow id>`` wake-up and by polling, and times attempts out.
- ``run_maintenance_task`` (``weft_django.run_maintenance``): one engine pass for hosts with
  ``BACKGROUND_TASKS = "manual"``; run it from celery beat.

Workers must import this module: ``Celery("proj", include=["weft_django.contrib.celery"])``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from ..engine import remote
from ..engine.celery_executor import RUN_ACTIVITY, CeleryExecutor, celery_app
from ..engine.maintenance import run_maintenance

logger = logging.getLogger(__name__)
RUN_MAINTENANCE = "weft_django.run_maintenance"


@shared_task(name=RUN_ACTIVITY, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_activity(
    self: Any,
    *,
    workflow_id: str,
    run_id: str,
    seq: int,
    attempt: int,
    epoch: int,
    activity: str,
    args_text: str,
    trace_context: str | None = None,
) -> str:
    """Run one activity attempt and commit its outcome, fenced by its epoch. ``acks_late`` with
    ``reject_on_worker_lost``: a worker that dies mid-attempt leaves the message to be redelivered;
    the redelivery runs only if the attempt is still wanted and records at most once."""
    key = remote.AttemptKey(workflow_id, run_id, seq, attempt, epoch)
    worker = self.request.hostname or ""
    return remote.run_attempt(key, activity, args_text, worker=worker, trace_context=trace_context)


@shared_task(name=RUN_MAINTENANCE, ignore_result=True)
def run_maintenance_task(engine_id: str | None = None, **ignored: Any) -> None:
    """weft.run_maintenance() as a Celery task, for BACKGROUND_TASKS = "manual" (schedule it with beat).

    The pass always runs under an engine id of its own (host, pid, a random suffix), never one taken
    from the message: whoever can publish to the broker could otherwise run it as another, live
    engine and end that engine's registration when the pass stops (docs/security.md). An
    ``engine_id`` in the message (older beat entries passed one) is ignored and logged."""
    if engine_id is not None or ignored:
        logger.warning(
            "run_maintenance task: ignoring the engine id %r and arguments %s of the message; the pass "
            "runs under an engine id of its own",
            engine_id,
            sorted(ignored),
        )
    run_maintenance()


__all__ = ["RUN_ACTIVITY", "RUN_MAINTENANCE", "CeleryExecutor", "celery_app", "run_activity", "run_maintenance_task"]
