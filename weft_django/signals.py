"""Django signals for workflow and ownership lifecycle events.

Every signal is sent with ``send_robust`` only after the transaction that made its event durable has
committed (``transaction.on_commit``; at once when no transaction is open), never inside an engine's
fenced commit. A receiver that raises is logged (logger ``django.dispatch``) and ignored: it never
breaks the engine or the caller. When no receiver is connected nothing is built or sent.

Senders (filter with ``connect(receiver, sender=...)``): workflow events are sent by
``weft_django.models.Workflow``, claim events by ``weft_django.models.WorkflowClaim``, activity events by
``weft_django.models.Step``. Every signal also passes ``using`` (the WEFT database alias).

Keyword arguments:

``workflow_started``: ``workflow_id``, ``run_id``, ``workflow_type``, ``version``, ``status`` ("running", or
"pending" for a delayed start or a queued scheduled run), ``parent_id`` (a child's parent, else None),
``schedule_id`` (the schedule that started it, else None). Sent by the process that started the run.

``workflow_completed``: ``workflow_id``, ``run_id``, ``workflow_type``, ``engine_id``, ``epoch``, ``result``
(the decoded return value).

``workflow_failed``: ``workflow_id``, ``run_id``, ``workflow_type``, ``engine_id``, ``epoch``, ``error`` (the
recorded error dict: ``type``, ``message``, ``traceback``, ...).

``workflow_cancelled`` / ``workflow_timed_out``: ``workflow_id``, ``run_id``, ``workflow_type``, ``reason``
(the cancel reason, else None), ``engine_id`` (the engine that ended it, or None when a transition in
any process did: cancel(), an execution deadline, a parent closing its children), ``epoch`` (None for
a transition).

``claim_acquired``: ``engine_id``, ``workflow_id``, ``epoch``. An unheld claim (a new run, a released
claim, a delayed start that came due) was taken.

``claim_taken_over``: ``engine_id``, ``workflow_id``, ``epoch``, ``previous_engine_id``. The previous
holder's claim had lapsed past the grace (or this engine is the single legitimate owner: "lease"
holder, "none"-mode start-up).

``claim_lost``: ``engine_id``, ``workflow_id``, ``run_id``, ``epoch`` (the epoch this engine held),
``reason``: "deposed" (renewal or a wake-up found another epoch or holder: a takeover, or a transition
such as suspend), "cancelled" (the run was cancelled), "lost_race" (a fenced commit was refused:
the claim moved on), "store_lease_lost" ("lease" mode). The engine stops driving the run. A reload at
the same epoch (an atomic activity's commit disagreed with the engine's context) is not a loss and
sends nothing; if the claim had moved on, the renewal or the next fenced commit reports it.

``activity_failed``: ``engine_id``, ``workflow_id``, ``run_id``, ``seq``, ``activity``, ``attempts``,
``error``. Sent once per activity step whose failure is final (retries exhausted or not retryable)
once that failure is committed; attempts that will be retried are not reported.
"""

from __future__ import annotations

from django.dispatch import Signal

# use_caching: has_listeners() is a dict lookup per sender, so the engine's check is nearly free.
workflow_started = Signal(use_caching=True)
workflow_completed = Signal(use_caching=True)
workflow_failed = Signal(use_caching=True)
workflow_cancelled = Signal(use_caching=True)
workflow_timed_out = Signal(use_caching=True)
claim_acquired = Signal(use_caching=True)
claim_taken_over = Signal(use_caching=True)
claim_lost = Signal(use_caching=True)
activity_failed = Signal(use_caching=True)

__all__ = [
    "activity_failed",
    "claim_acquired",
    "claim_lost",
    "claim_taken_over",
    "workflow_cancelled",
    "workflow_completed",
    "workflow_failed",
    "workflow_started",
    "workflow_timed_out",
]
