"""The tables. Payload columns hold codec text (never jsonb): what replay reads must equal what the
live run saw. Engine-owned state is written only through engine/fencing.py, engine/ownership.py and
transitions.py."""

from __future__ import annotations

import uuid

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.db.models import Q

from .status import (
    OverlapPolicy,
    OwnershipMode,
    QueryStatus,
    SignalState,
    StepKind,
    StepStatus,
    TimerKind,
    UpdateStatus,
    WorkflowStatus,
)

NOT_INSTALLED = (
    '"weft_django" is not in INSTALLED_APPS, so weft has no tables and nothing runs workflows. Add "weft_django" '
    "to INSTALLED_APPS in your settings, then run `python manage.py migrate` (creates weft's tables) and "
    "`python manage.py weft_engine` (runs the workflows)."
)
if apps.apps_ready and not apps.is_installed("weft_django"):
    # Otherwise Django's own RuntimeError ("doesn't declare an explicit app_label") is all the user sees.
    raise ImproperlyConfigured(NOT_INSTALLED)

_ACTIVE = Q(status__in=[WorkflowStatus.PENDING, WorkflowStatus.RUNNING, WorkflowStatus.SUSPENDED])


class Workflow(models.Model):
    """One row per workflow id, holding its latest run."""

    id = models.CharField(primary_key=True, max_length=255)
    run_id = models.UUIDField(default=uuid.uuid4)
    workflow_type = models.CharField(max_length=255)
    version = models.CharField(max_length=64, default="1")
    status = models.CharField(max_length=16, choices=WorkflowStatus.choices, default=WorkflowStatus.RUNNING)
    input = models.TextField(help_text="Codec text of {'args': [...], 'kwargs': {...}}.")
    result = models.TextField(null=True, blank=True, help_text="Codec text of the return value.")
    error = models.JSONField(null=True, blank=True, help_text="{'type', 'message', 'traceback'} when failed.")
    parent_id = models.CharField(max_length=255, null=True, blank=True, db_index=True)
    parent_run_id = models.UUIDField(null=True, blank=True)
    parent_seq = models.IntegerField(null=True, blank=True)
    parent_close_policy = models.CharField(max_length=16, default="terminate")
    depth = models.PositiveSmallIntegerField(default=0)
    schedule_id = models.CharField(max_length=255, null=True, blank=True, db_index=True)
    idempotency_key = models.CharField(max_length=320, null=True, blank=True)
    start_at = models.DateTimeField(null=True, blank=True)
    execution_deadline = models.DateTimeField(null=True, blank=True)
    current_step = models.CharField(max_length=255, blank=True, default="")
    # NonDeterminismError / VersionMismatchError: the run stays running; engines retry after back-off.
    stuck_error = models.JSONField(null=True, blank=True)
    stuck_retry_at = models.DateTimeField(null=True, blank=True)
    stuck_attempts = models.PositiveIntegerField(default=0)
    cancel_reason = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The starter's W3C trace context (weft_django.tracing), when tracing was on: the run's spans are its children.
    trace_context = models.TextField(null=True, blank=True)
    # Flow control (docs/queues.md): the queue the run waits in (pending until admitted), its priority
    # (lower first), its concurrency key (one admitted and not ended per queue and key) and when it was
    # admitted (the database clock; the rate window counts these).
    queue = models.CharField(max_length=255, null=True, blank=True)
    priority = models.IntegerField(default=0)
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    # The start's execution_timeout: a queued run's execution_deadline is set from it at admission (a
    # run waiting in its queue is not timing out yet); others' deadline is set at start.
    execution_timeout = models.DurationField(null=True, blank=True)
    # weft.fork: where the run's ctx.random() seeds and ctx.now() start come from below its fork point
    # (deterministic.Lineage.to_json, naming the run it belongs to); null for other runs.
    fork_origin = models.JSONField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["status", "workflow_type"], name="weft_wf_active", condition=_ACTIVE),
            # Admission: the waiting runs of a queue in order; its admitted, not ended runs (slots, keys);
            # its admissions in time order (the rate window).
            models.Index(
                fields=["queue", "priority", "created_at", "id"],
                name="weft_wf_queue_wait",
                condition=Q(queue__isnull=False, status="pending", admitted_at__isnull=True),
            ),
            models.Index(
                fields=["queue", "concurrency_key"],
                name="weft_wf_queue_slot",
                condition=_ACTIVE & Q(queue__isnull=False, admitted_at__isnull=False),
            ),
            models.Index(fields=["queue", "admitted_at"], name="weft_wf_queue_rate", condition=Q(queue__isnull=False)),
            models.Index(fields=["status", "finished_at"], name="weft_wf_terminal", condition=~_ACTIVE),
            models.Index(fields=["created_at"], name="weft_wf_created"),
            # The claim scan walks running workflows oldest first and looks their claims up by key.
            models.Index(fields=["created_at", "id"], name="weft_wf_running", condition=Q(status="running")),
        ]
        permissions = [
            ("cancel_workflow", "Can cancel, suspend and resume workflows"),
            ("retry_workflow", "Can retry failed workflows"),
            ("signal_workflow", "Can send signals to workflows"),
            ("purge_workflow", "Can purge terminal workflows"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.workflow_type}, {self.status})"


class WorkflowClaim(models.Model):
    """Ownership of one workflow. The epoch never goes down for an id (drawn from a global sequence);
    a null engine_id means released or never claimed. Renewal rewrites expires_at only (narrow row,
    expiry unindexed, pages half empty on PostgreSQL (migration 0008), so renewals stay HOT updates).

    ``runnable`` is False while the run is terminal, suspended or waiting in a queue (no engine should
    acquire it; a queue's admission holds it and sets it, store/claims/admission.py), so the
    claims an engine may acquire are the few rows of the partial index weft_claim_free, not every
    unheld claim: finished runs' claims are unheld too and stay until retention purges them. Every
    transition that ends or suspends a run clears it in the same transaction; every one that makes a
    run active again (start, id reuse, retry, resume) sets it. The engine index covers held claims
    only, and PostgreSQL keeps joint statistics of (engine_id, runnable) (migration 0009): the two
    are strongly correlated, and estimated independently the planner expects a quarter of the table
    to be claimable and reads the unheld claims (finished runs included) instead of weft_claim_free."""

    workflow_id = models.CharField(primary_key=True, max_length=255)
    epoch = models.BigIntegerField(default=0)
    engine_id = models.CharField(max_length=255, null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    # The engine that last took the claim: written by the same statement that makes an engine the
    # holder, never cleared by a release, so it still names the engine that ran a run to its end after
    # the terminal commit cleared engine_id. Epoch changes with no holder (a transition from outside:
    # cancel, terminate, suspend, resume, retry, a new run under the id) leave it as it was, so it may
    # name the holder of an earlier epoch. Not indexed: renewals stay HOT updates.
    last_engine_id = models.CharField(max_length=255, null=True, blank=True)
    # db_default too: a raw INSERT that does not name the column still makes a claimable row.
    runnable = models.BooleanField(default=True, db_default=True)
    # The run's created_at (acquire's FIFO order), copied so weft_claim_free can hand out the oldest
    # claimable runs in index order and stop at the batch size. Null only if a writer forgot it: the
    # run is still acquired (sorted apart), never stranded.
    run_created_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["engine_id"], name="weft_claim_holder", condition=Q(engine_id__isnull=False)),
            models.Index(
                fields=["run_created_at"],
                name="weft_claim_free",
                condition=Q(engine_id__isnull=True, runnable=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_id}@{self.epoch} by {self.engine_id or '-'}"


class Step(models.Model):
    """The checkpoint log replay reads: one row per (run, seq)."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="steps", db_constraint=False)
    run_id = models.UUIDField()
    seq = models.IntegerField()
    kind = models.CharField(max_length=16, choices=StepKind.choices)
    name = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    result = models.TextField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    epoch = models.BigIntegerField()
    started_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run_id", "seq"], name="weft_step_run_seq")]

    def __str__(self) -> str:
        return f"{self.workflow_id}#{self.seq} {self.kind} {self.name}"


class AppliedUpdate(models.Model):
    """An update handler that ran, re-applied on replay at the yield it arrived at."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    run_id = models.UUIDField()
    seq = models.IntegerField()
    n = models.IntegerField()
    name = models.CharField(max_length=255)
    payload = models.TextField()
    result = models.TextField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    update_id = models.UUIDField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run_id", "seq", "n"], name="weft_applied_run_seq_n")]

    def __str__(self) -> str:
        return f"{self.workflow_id}#{self.seq}.{self.n} {self.name}"


class Timer(models.Model):
    # No index of its own: weft_timer_wf (workflow, fire_at) serves lookups by workflow.
    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="timers", db_constraint=False, db_index=False
    )
    run_id = models.UUIDField(null=True, blank=True)
    kind = models.CharField(max_length=24, choices=TimerKind.choices)
    seq = models.IntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    fire_at = models.DateTimeField(db_index=True)

    class Meta:
        indexes = [
            models.Index(fields=["workflow", "fire_at"], name="weft_timer_wf"),
            # Engine-scoped due scans (delayed starts) filter by kind: without it they walk every
            # past-due timer of other kinds (e.g. the sleeps of suspended runs) on each poll.
            models.Index(fields=["kind", "fire_at"], name="weft_timer_kind_fire_at"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.workflow_id}#{self.seq} at {self.fire_at}"


class BufferedSignal(models.Model):
    """A signal, durable from the moment signal() returns; consumed with the step that consumes it."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="signals", db_constraint=False)
    run_id = models.UUIDField()
    name = models.CharField(max_length=255)
    signal_id = models.CharField(max_length=320, null=True, blank=True)
    payload = models.TextField()
    state = models.CharField(max_length=16, choices=SignalState.choices, default=SignalState.BUFFERED)
    consumed_seq = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    trace_context = models.TextField(null=True, blank=True)  # the sender's trace context (weft_django.tracing)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run_id", "signal_id"],
                name="weft_signal_id_per_run",
                condition=Q(signal_id__isnull=False),
            )
        ]
        indexes = [
            models.Index(fields=["workflow", "name", "id"], name="weft_signal_buffered", condition=Q(state="buffered"))
        ]

    def __str__(self) -> str:
        return f"{self.name} -> {self.workflow_id} ({self.state})"


class PendingUpdate(models.Model):
    """An update request: durable from admission, answered by the owner in a fenced commit."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="updates", db_constraint=False)
    run_id = models.UUIDField()
    name = models.CharField(max_length=255)
    payload = models.TextField()
    idempotency_key = models.CharField(max_length=320, null=True, blank=True)
    status = models.CharField(max_length=16, choices=UpdateStatus.choices, default=UpdateStatus.ADMITTED)
    result = models.TextField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    issues = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    # When the caller stops waiting (workflow time). An admitted update left past it by a caller that
    # died is expired by the engines' message cleanup.
    deadline = models.DateTimeField(null=True, blank=True)
    trace_context = models.TextField(null=True, blank=True)  # the sender's trace context (weft_django.tracing)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run_id", "idempotency_key"],
                name="weft_update_key_per_run",
                condition=Q(idempotency_key__isnull=False),
            )
        ]
        indexes = [
            models.Index(fields=["workflow", "created_at"], name="weft_update_admitted", condition=Q(status="admitted"))
        ]

    def __str__(self) -> str:
        return f"{self.name} -> {self.workflow_id} ({self.status})"


class QueryRequest(models.Model):
    """A query routed through the database to the engine that owns the workflow."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    workflow_id = models.CharField(max_length=255)
    engine_id = models.CharField(max_length=255, null=True, blank=True, db_index=True)
    name = models.CharField(max_length=255)
    arg = models.TextField(null=True, blank=True)
    has_arg = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=QueryStatus.choices, default=QueryStatus.PENDING)
    result = models.TextField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    deadline = models.DateTimeField(null=True, blank=True)  # when the caller stops waiting (workflow time)

    class Meta:
        indexes = [
            models.Index(fields=["engine_id", "created_at"], name="weft_query_pending", condition=Q(status="pending"))
        ]

    def __str__(self) -> str:
        return f"{self.name} -> {self.workflow_id} ({self.status})"


class IdempotencyKey(models.Model):
    """Start idempotency key -> workflow id. Outlives purge so a reused key can say so."""

    key = models.CharField(primary_key=True, max_length=320)
    workflow_id = models.CharField(max_length=255)
    run_id = models.UUIDField()
    created_at = models.DateTimeField()
    purged_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.key} -> {self.workflow_id}"


class Schedule(models.Model):
    id = models.CharField(primary_key=True, max_length=200)
    workflow_type = models.CharField(max_length=255)
    cron = models.CharField(max_length=255, null=True, blank=True)
    every = models.PositiveIntegerField(null=True, blank=True, help_text="Seconds between fires.")
    timezone = models.CharField(max_length=64, default="UTC")
    args = models.TextField(default="[]")
    kwargs = models.TextField(default="{}")
    overlap = models.CharField(max_length=16, choices=OverlapPolicy.choices, default=OverlapPolicy.SKIP)
    backfill = models.BooleanField(default=False)
    jitter_ms = models.PositiveIntegerField(default=0)
    paused = models.BooleanField(default=False)
    note = models.TextField(blank=True, default="")
    next_fire_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # The un-jittered time of the occurrence due at next_fire_at: its run id is derived from it.
    next_nominal_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    missed_fire_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.id


class Engine(models.Model):
    """One weft_engine process, with its heartbeat."""

    id = models.CharField(primary_key=True, max_length=255)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    mode = models.CharField(max_length=16, choices=OwnershipMode.choices)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    # The queues it admits from (weft_engine --queues), or None: every queue of WEFT["QUEUES"].
    queues = models.JSONField(null=True, blank=True)

    def __str__(self) -> str:
        return self.id


class ActivitySlot(models.Model):
    """A running attempt of an activity with limits (``@weft.activity(concurrency=, rate=,
    concurrency_key=)``): taken at dispatch, released with the attempt's outcome. A slot counts while
    it is not released and its workflow's claim is still at its epoch with its engine, so a frozen or
    dead engine's slots come back when its claims are taken over. Released slots stay for the rate
    window, then go."""

    activity = models.CharField(max_length=255)
    key = models.CharField(max_length=255, null=True, blank=True)
    workflow_id = models.CharField(max_length=255)
    run_id = models.UUIDField()
    seq = models.IntegerField()
    attempt = models.PositiveIntegerField()
    epoch = models.BigIntegerField()
    engine_id = models.CharField(max_length=255)
    acquired_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["activity", "key"], name="weft_slot_held", condition=Q(released_at__isnull=True)),
            models.Index(fields=["activity", "acquired_at"], name="weft_slot_rate"),
        ]

    def __str__(self) -> str:
        return f"{self.activity}[{self.key or '-'}] {self.workflow_id}#{self.seq}.{self.attempt}"


class StoreLease(models.Model):
    """The one store-wide lease of OWNERSHIP="lease" (a single row, id=1)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    epoch = models.BigIntegerField(default=0)
    engine_id = models.CharField(max_length=255, null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"lease@{self.epoch} by {self.engine_id or '-'}"


class OwnershipMarker(models.Model):
    """The fencing mode the store runs under (a single row, id=1): engines of another mode refuse to start."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    mode = models.CharField(max_length=16, choices=OwnershipMode.choices)
    set_by = models.CharField(max_length=255)
    set_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.mode


class ClockOffset(models.Model):
    """Workflow time = database time + offset (a single row, id=1). Tests skip time by moving it."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    offset_ms = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.offset_ms} ms"


class EpochCounter(models.Model):
    """Where databases have no sequence (SQLite), epochs come from this one-row counter."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    value = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return str(self.value)


class RemoteAttemptState(models.TextChoices):
    SENT = "sent", "Sent"  # on its way to (or running on) a worker
    FAILED = "failed", "Failed"  # the worker recorded an error; the owner turns it into a retry or ActivityError
    EXPIRED = "expired", "Expired"  # the owner timed it out first: the worker can no longer commit it


class RemoteAttempt(models.Model):
    """An activity attempt run outside the engine (a Celery worker), keyed by (run, seq, attempt, epoch).

    The engine writes it when it sends the attempt and marks it expired when the attempt times out;
    the worker writes heartbeats and, for an error, marks it failed. A result goes straight into the
    Step (engine/remote.py), which deletes the step's rows here."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    run_id = models.UUIDField()
    seq = models.IntegerField()
    attempt = models.PositiveIntegerField()
    epoch = models.BigIntegerField()
    activity = models.CharField(max_length=255)
    queue = models.CharField(max_length=255, blank=True, default="")
    state = models.CharField(max_length=16, choices=RemoteAttemptState.choices, default=RemoteAttemptState.SENT)
    worker = models.CharField(max_length=255, blank=True, default="")
    details = models.TextField(null=True, blank=True, help_text="Codec text of the latest heartbeat details.")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    error_types = models.JSONField(null=True, blank=True, help_text="The exception's class names (MRO).")
    sent_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run_id", "seq", "attempt", "epoch"], name="weft_remote_attempt_key")
        ]

    def __str__(self) -> str:
        return f"{self.workflow_id}#{self.seq} attempt {self.attempt}@{self.epoch} ({self.state})"


class WorkflowAttribute(models.Model):
    """One search attribute value of a workflow's latest run (issue 19, ADR 0010): a typed side table
    (one typed column filled per row, the others null) so an equality or range filter is a btree
    range scan of ``(name, value)`` on PostgreSQL and SQLite alike. A keyword list is one row per
    element (``position``). Written by ``store/visibility.py`` only: with the workflow's fenced
    commit (``ctx.set_attributes``) or with its start; deleted with the run's rows (purge, id reuse)."""

    # The unique constraint's leading column serves lookups by workflow: no index of its own.
    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False
    )
    name = models.CharField(max_length=100)
    position = models.PositiveSmallIntegerField(default=0)
    kind = models.CharField(max_length=16)  # str, int, float, bool, datetime, keywords
    str_value = models.CharField(max_length=500, null=True, blank=True)
    num_value = models.FloatField(null=True, blank=True)
    time_value = models.DateTimeField(null=True, blank=True)
    bool_value = models.BooleanField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow", "name", "position"], name="weft_attr_wf_name_pos")]
        indexes = [
            models.Index(
                fields=["name", "str_value", "workflow"], name="weft_attr_str", condition=Q(str_value__isnull=False)
            ),
            models.Index(
                fields=["name", "num_value", "workflow"], name="weft_attr_num", condition=Q(num_value__isnull=False)
            ),
            models.Index(
                fields=["name", "time_value", "workflow"], name="weft_attr_time", condition=Q(time_value__isnull=False)
            ),
            models.Index(
                fields=["name", "bool_value", "workflow"], name="weft_attr_bool", condition=Q(bool_value__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_id}.{self.name}[{self.position}]"


class ContinuedRun(models.Model):
    """A run that ended by continuing as new (``ctx.continue_as_new``): the chain of a workflow's runs.
    The workflow's row holds its latest run; each earlier run keeps its steps (by run id) and this
    row, which names the run that followed it."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    run_id = models.UUIDField(unique=True)
    next_run_id = models.UUIDField(unique=True)
    workflow_type = models.CharField(max_length=255)
    version = models.CharField(max_length=64)
    input = models.TextField(help_text="Codec text of the run's {'args', 'kwargs'}.")
    steps = models.PositiveIntegerField(default=0, help_text="How many steps the run recorded.")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["workflow", "finished_at"], name="weft_continued_chain")]

    def __str__(self) -> str:
        return f"{self.workflow_id} run {self.run_id} -> {self.next_run_id}"
