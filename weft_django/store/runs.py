"""Runs and steps: creating a run (start, children, schedules), writing steps, run status rows."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Count, IntegerField, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from ..models import IdempotencyKey, Step, Timer, Workflow, WorkflowClaim
from ..status import StepStatus, TimerKind, WorkflowStatus
from . import claims, notify, prepared
from .backend import backend
from .clock import db_now, workflow_now_sql
from .epochs import next_epoch, next_epoch_sql
from .moments import readable, readable_sql

# -- client side (start, handles, transitions, schedules, testing) --------------------------


@dataclasses.dataclass
class NewRun:
    """A run to create (``create_run``): a start, a schedule's occurrence or a child.

    Attributes:
        workflow_id, workflow_type, version: the run's id and its workflow definition.
        input_text: the codec text of ``{"args": [...], "kwargs": {...}}``.
        delay: a delay or a moment to start at (the run is ``pending`` with a delayed-start timer
            until then), or None: it starts at once.
        execution_timeout: the run's execution deadline, from when it begins (a queued run's: from
            its admission; stored on the row, ``Workflow.execution_timeout``).
        idempotency_key: the key the start was given (its row is inserted with the run).
        schedule_id: the schedule whose occurrence this is.
        queued: ``pending`` with no timer (a schedule's overlap="queue": released later).
        parent_id, parent_run_id, parent_seq, parent_close_policy, depth: a child's link to its parent.
        run_id: the new run id (a fresh one when empty).
        trace_context: the starter's trace context (``weft_django.tracing.capture``), or None.
        queue, priority, concurrency_key: the queue the run waits in (``pending`` until an engine
            admits it, ``store/queues.py``), its priority there (lower first) and its concurrency key.
    """

    workflow_id: str
    workflow_type: str
    version: str
    input_text: str
    delay: timedelta | datetime | None = None
    execution_timeout: timedelta | None = None
    idempotency_key: str | None = None
    schedule_id: str | None = None
    queued: bool = False
    parent_id: str | None = None
    parent_run_id: str | None = None
    parent_seq: int | None = None
    parent_close_policy: str | None = None
    depth: int = 0
    run_id: Any = None
    trace_context: str | None = None
    queue: str | None = None
    priority: int = 0
    concurrency_key: str | None = None

    def rows(self, now: datetime) -> tuple[Workflow, Timer | None]:
        """The run's row at workflow time ``now`` and its delayed-start timer (None: it starts now)."""
        begins = self.delay if isinstance(self.delay, datetime) else now + (self.delay or timedelta(0))
        delayed = begins > now
        if not delayed:
            begins = now
        waits = delayed or self.queued or self.queue is not None
        links: dict[str, Any] = {}
        if self.schedule_id is not None:
            links["schedule_id"] = self.schedule_id
        if self.parent_id is not None:
            links.update(
                parent_id=self.parent_id,
                parent_run_id=self.parent_run_id,
                parent_seq=self.parent_seq,
                parent_close_policy=self.parent_close_policy,
                depth=self.depth,
            )
        run = Workflow(
            id=self.workflow_id,
            run_id=self.run_id or uuid.uuid4(),
            workflow_type=self.workflow_type,
            version=self.version,
            status=WorkflowStatus.PENDING if waits else WorkflowStatus.RUNNING,
            input=self.input_text,
            idempotency_key=self.idempotency_key,
            start_at=begins if delayed else None,
            # a queued run's deadline counts from its admission (store/queues.py), not from now
            execution_deadline=(
                begins + self.execution_timeout if self.execution_timeout is not None and self.queue is None else None
            ),
            execution_timeout=self.execution_timeout,
            created_at=now,
            updated_at=now,
            started_at=None if waits else now,
            trace_context=self.trace_context,
            queue=self.queue,
            priority=self.priority,
            concurrency_key=self.concurrency_key,
            **links,
        )
        timer = Timer(workflow_id=self.workflow_id, run_id=run.run_id, kind=TimerKind.DELAYED_START, fire_at=begins)
        return run, timer if delayed else None


def one_statement(new: NewRun, using: str) -> bool:
    """Whether ``create_run(new, using)`` is one statement (PostgreSQL, a plain start, current models):
    then in autocommit it is its own transaction, and a taken id or key leaves the caller's
    transaction usable without a savepoint."""
    return _start_statement(new, using) is not None


def create_run(
    new: NewRun, using: str, *, now: datetime | None = None, wake: bool = True, savepoint: bool = True
) -> Workflow | str | None:
    """Create a run: its row, its unheld claim (a fresh epoch, through ``store.claims``), its
    idempotency key and delayed-start timer if any, and the wake-up, in the caller's transaction
    (joined, or a savepoint of it: a taken id writes nothing and leaves it usable).

    Args:
        new: the run.
        using: the connection alias.
        now: the run's created_at (a schedule's firing time, a parent's commit time); default
            workflow time now.
        wake: send the ``w:<id>`` wake-up (a child's parent sends them for all its children at once).
        savepoint: False inside a caller's ``atomic()`` that is rolled back anyway when the id is taken
            (one round trip less each way); the caller's transaction is then unusable after None.

    Returns:
        The saved row, or its id (the one-statement start), or None when the id or the
        idempotency key is taken (nothing written).
    """
    if now is None and wake and _start_statement(new, using) is not None:
        return new.workflow_id if _insert_run_sql(new, using) else None
    if now is None:
        now, epoch = now_and_epoch(using)
    else:
        epoch = None
    run, timer = new.rows(now)
    try:
        with transaction.atomic(using=using, savepoint=savepoint):
            if new.idempotency_key is not None:
                # The key's primary key is where concurrent starts with one key meet: one insert wins,
                # the others wait for its transaction and fail, then find the winner's run.
                IdempotencyKey(
                    key=new.idempotency_key, workflow_id=new.workflow_id, run_id=run.run_id, created_at=now
                ).save(using=using, force_insert=True)
            run.save(using=using, force_insert=True)
            epoch = next_epoch(using) if epoch is None else epoch
            # A run waiting in a queue stays out of acquire's partial index until its admission.
            claims.write_claim(new.workflow_id, epoch, using, runnable=new.queue is None, created_at=now)
            if timer is not None:
                timer.save(using=using, force_insert=True)
            if wake:
                notify.send("w", new.workflow_id, using)
    except IntegrityError:
        return None
    return run


def replace_run(new: NewRun, using: str) -> Workflow:
    """Write a new run over the row of a finished one (on_conflict="start_new"), in the caller's
    transaction: the run row, a new epoch for its claim (no holder), its delayed-start timer if any,
    and the wake-up. The caller holds the claim and workflow locks and deleted the old run's rows.
    Returns the saved row."""
    run, timer = new.rows(db_now(using))
    run.save(using=using, force_update=True)
    claims.rotate_epoch(new.workflow_id, using, runnable=new.queue is None)  # queued: runnable at admission
    if timer is not None:
        timer.save(using=using, force_insert=True)
    notify.send("w", new.workflow_id, using)
    return run


def now_and_epoch(using: str) -> tuple[datetime, int]:
    """Workflow time and a fresh epoch, in one round trip where the database can."""
    store = backend(using)
    if store.writes_in_one_statement:
        with store.connection.cursor() as cursor:
            cursor.execute(f"SELECT {workflow_now_sql('postgresql')}, {next_epoch_sql('postgresql')}")
            now, epoch = cursor.fetchone()
        return now, int(epoch)
    return db_now(using), next_epoch(using)


# The one-statement start (PostgreSQL). One round trip, and in autocommit one transaction: the clock,
# a fresh epoch, the idempotency key (if any), the run, its claim and its delayed-start timer (if any).
# A taken id or key makes the statement insert nothing and return no row (ON CONFLICT DO NOTHING waits
# for a concurrent inserter's transaction, as a unique violation would), so it never raises for a
# conflict and never breaks the caller's transaction. Every data-modifying CTE runs once.
#
# The wake-up is sent AFTER the commit, as its own statement (in a caller's atomic(): on its commit),
# not inside the start's transaction (NOTIFY_AFTER_COMMIT). A transaction that has sent a NOTIFY
# takes PostgreSQL's one notification-queue lock (a lock on the object "database 0") at commit and
# holds it until its commit record is flushed: every notifying commit of the server waits for the
# previous one's fsync, so concurrent start() calls were serialised by it (benchmarks/bulk_starts.py,
# docs/benchmarks.md: "Lock:object" was 93% of the waits of 16 client threads) and never shared a
# WAL flush. A transaction that only sends a NOTIFY writes no WAL of its own and commits without
# waiting for a flush, so it holds that lock for microseconds. The wake-up still never overtakes its
# row; if the client dies between the two, the engines' poll (POLL_INTERVAL) finds the run.
NOTIFY_AFTER_COMMIT = True
# In autocommit, the start and its wake-up after the commit go in ONE round trip (NOTIFY_PIPELINED):
# "BEGIN; EXECUTE <start>; COMMIT; SELECT pg_notify(...)" as one query string, which the server runs
# in order, the NOTIFY in a transaction of its own once the start's commit is flushed. Both gains at
# once: no notification-queue lock held across the flush, no second round trip
# (prepared.execute_committed_then). The wake-up is sent only if this very run was inserted (its
# run_id, read after the commit). Inside a caller's atomic() the wake-up follows its commit as before.
NOTIFY_PIPELINED = True
_THIS_RUN = f"FROM {Workflow._meta.db_table} WHERE id = %s AND run_id = %s"  # the run this call inserted
_PIPELINED_WAKE = f"SELECT pg_notify('{notify.CHANNEL}', %s) {_THIS_RUN}"
_RUN_GIVEN = {
    "id",
    "run_id",
    "workflow_type",
    "version",
    "input",
    "idempotency_key",
    "trace_context",
    "queue",
    "priority",
    "concurrency_key",
}
_CLAIM_COLUMNS = {
    "workflow_id",
    "epoch",
    "engine_id",
    "last_engine_id",
    "claimed_at",
    "expires_at",
    "runnable",
    "run_created_at",
}
_TIMER_COLUMNS = {"id", "workflow_id", "run_id", "kind", "seq", "attempt", "fire_at"}
_KEY_COLUMNS = {"key", "workflow_id", "run_id", "created_at", "purged_at"}
_start_statements: dict[tuple[str, bool, bool, bool, bool], tuple[str, dict[str, Any]] | None] = {}


def _start_statement(new: NewRun, using: str) -> tuple[str, dict[str, Any]] | None:
    """The SQL and constant parameters of the one-statement start for this run's shape, or None where
    it does not apply (not PostgreSQL, a schedule's or a child's run, or a model with a column this
    statement does not know how to fill)."""
    store = backend(using)
    if (
        not store.writes_in_one_statement
        or new.queued
        or new.schedule_id is not None
        or new.parent_id is not None
        or (new.queue is not None and new.delay is not None)
    ):
        return None
    delay = "none" if new.delay is None else ("at" if isinstance(new.delay, datetime) else "after")
    shape = (delay, new.execution_timeout is not None, new.idempotency_key is not None, new.queue is not None)
    key = (*shape, NOTIFY_AFTER_COMMIT)
    if key not in _start_statements:
        _start_statements[key] = _build_start_statement(store.connection, *shape, wake=not NOTIFY_AFTER_COMMIT)
    return _start_statements[key]


def _build_start_statement(
    connection: Any, delay: str, timeout: bool, keyed: bool, queued: bool, *, wake: bool = True
) -> tuple[str, dict[str, Any]] | None:
    """The one-statement start of this shape; ``wake``: its last SELECT sends the NOTIFY (inside the
    statement's transaction), else it returns the inserted id and the caller sends it after commit."""

    def columns(model: Any) -> set[str]:
        return {field.column for field in model._meta.concrete_fields}

    if (
        columns(WorkflowClaim) != _CLAIM_COLUMNS
        or columns(Timer) != _TIMER_COLUMNS
        or columns(IdempotencyKey) != _KEY_COLUMNS
    ):
        return None  # the models changed: the ORM path stays correct until this statement is updated
    begins = {"none": "c.t", "after": "c.t + %(delay)s::interval", "at": "GREATEST(%(delay)s::timestamptz, c.t)"}
    delayed = "n.b > n.t"
    pending, running = f"'{WorkflowStatus.PENDING.value}'", f"'{WorkflowStatus.RUNNING.value}'"
    expressions = {
        "created_at": "n.t",
        "updated_at": "n.t",
        "status": running if delay == "none" else f"CASE WHEN {delayed} THEN {pending} ELSE {running} END",
        "started_at": "n.t" if delay == "none" else f"CASE WHEN {delayed} THEN NULL ELSE n.t END",
        **({"status": pending, "started_at": "NULL"} if queued else {}),  # waits for its queue's admission
        "start_at": "NULL" if delay == "none" else f"CASE WHEN {delayed} THEN n.b END",
        # a queued run's deadline counts from its admission (store/queues.py), not from its start
        "execution_deadline": "n.b + %(timeout)s::interval" if timeout and not queued else "NULL",
        "execution_timeout": "%(timeout)s::interval" if timeout else "NULL",
    }
    constants: dict[str, Any] = {}
    names: list[str] = []
    values: list[str] = []
    for field in Workflow._meta.concrete_fields:
        names.append(connection.ops.quote_name(field.column))
        if field.attname in expressions:
            values.append(expressions[field.attname])
        elif field.attname in _RUN_GIVEN:
            values.append(f"%({field.attname})s")
        elif field.has_default() and not callable(field.default):
            if field.default is None:
                values.append("NULL")
            else:
                constants[f"d_{field.attname}"] = field.get_db_prep_save(field.default, connection)
                values.append(f"%(d_{field.attname})s")
        elif field.null and not field.has_default():
            values.append("NULL")
        else:
            return None  # a required column with no constant default: only the ORM knows how to fill it
    key_cte = (
        f"k AS (INSERT INTO {IdempotencyKey._meta.db_table} (key, workflow_id, run_id, created_at, purged_at) "
        f"SELECT %(idempotency_key)s, %(id)s, %(run_id)s, n.t, NULL FROM n ON CONFLICT DO NOTHING RETURNING 1), "
        if keyed
        else ""
    )
    timer_cte = (
        f", s AS (INSERT INTO {Timer._meta.db_table} (workflow_id, run_id, kind, seq, attempt, fire_at) "
        f"SELECT w.id, %(run_id)s, '{TimerKind.DELAYED_START.value}', NULL, NULL, n.b FROM w, n WHERE {delayed})"
        if delay != "none"
        else ""
    )
    sql = (
        f"WITH n AS (SELECT c.t, {next_epoch_sql('postgresql')} AS e, {begins[delay]} AS b "
        f"FROM (SELECT {workflow_now_sql('postgresql')} AS t) AS c), "
        f"{key_cte}"
        f"w AS (INSERT INTO {Workflow._meta.db_table} ({', '.join(names)}) SELECT {', '.join(values)} FROM n"
        f"{' WHERE EXISTS (SELECT 1 FROM k)' if keyed else ''} ON CONFLICT DO NOTHING RETURNING id), "
        f"{claims.unheld_claim_sql(runnable='FALSE' if queued else 'TRUE')}"
        f"{timer_cte} "
        + (f"SELECT pg_notify('{notify.CHANNEL}', %(payload)s) FROM w" if wake else "SELECT w.id FROM w")
    )
    return sql, constants


def _insert_run_sql(new: NewRun, using: str) -> bool:
    """The one-statement start; whether the run was inserted (False: the id or the key is taken)."""
    statement = _start_statement(new, using)
    assert statement is not None
    sql, constants = statement
    params = {
        **constants,
        "id": new.workflow_id,
        "run_id": new.run_id or uuid.uuid4(),
        "workflow_type": new.workflow_type,
        "version": new.version,
        "input": new.input_text,
        "idempotency_key": new.idempotency_key,
        "trace_context": new.trace_context,
        "queue": new.queue,
        "priority": new.priority,
        "concurrency_key": new.concurrency_key,
        "delay": new.delay,
        "timeout": new.execution_timeout,
    }
    after_commit = NOTIFY_AFTER_COMMIT
    payload = f"w:{new.workflow_id}"  # ids are at most 255 characters: under notify.MAX_PAYLOAD
    if not after_commit:
        params["payload"] = payload
    connection = connections[using]
    with connection.cursor() as cursor:
        # Only with a fresh run_id: _landed then tells this call's row from any other.
        if after_commit and NOTIFY_PIPELINED and new.run_id is None and backend(using).listens:
            wake = [payload, new.workflow_id, params["run_id"]]
            try:
                rows = prepared.execute_committed_then(cursor, connection, sql, params, _PIPELINED_WAKE, wake)
            except DatabaseError:
                if not _landed(using, new.workflow_id, params["run_id"]):
                    raise
                # The start committed and its wake-up failed (a full notification queue): as for
                # send_after_commit, logged; the engines' poll finds the run.
                notify.logger.warning("weft wake-up not sent (the engines' poll finds the run) w:%s", new.workflow_id)
                return True
            if rows is not None:
                return bool(rows)
        prepared.execute(cursor, connection, sql, params)  # outside atomic(): prepared (planning > run)
        inserted = cursor.fetchone() is not None
    if inserted and after_commit:
        notify.send_after_commit("w", new.workflow_id, using)
    return inserted


def _landed(using: str, workflow_id: str, run_id: Any) -> bool:
    """Whether run ``run_id`` (fresh: no other call wrote it) of ``workflow_id`` exists: after a
    pipelined start failed, whether its start had committed before the failure. Read on a connection
    of its own (the failure may have been the loss of the caller's); False when it cannot be read."""
    try:
        reader = notify.connect(using)
    except Exception:  # the database cannot be reached: unknown, the caller's error stands
        return False
    try:
        return reader.execute(f"SELECT 1 {_THIS_RUN}", [workflow_id, run_id]).fetchone() is not None
    except Exception:
        return False
    finally:
        reader.close()


def pending_timers(using: str) -> Coalesce:
    """A ``Workflow`` annotation: how many timers the run has pending (0 for none), as one subquery."""
    count = (
        Timer.objects.using(using)
        .filter(workflow_id=OuterRef("pk"))
        .order_by()
        .values("workflow_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(count, output_field=IntegerField()), 0)


RESULT_FIELDS = ("status", "result", "error", "cancel_reason", "execution_deadline", "run_id", "created_at")
# The two timestamps through store/moments.readable: one a hand edit put past year 9999 reads as None
# (result() needs neither to return the run's outcome), not as DataError from every result() call.
_RESULT_MOMENTS = ("execution_deadline", "created_at")
_RESULT_SQL = "SELECT {} FROM {} WHERE id = %s".format(
    ", ".join(readable_sql(name)[0] if name in _RESULT_MOMENTS else name for name in RESULT_FIELDS),
    Workflow._meta.db_table,
)
_RESULT_PARAMS = [param for name in RESULT_FIELDS if name in _RESULT_MOMENTS for param in readable_sql(name)[1]]


def read_end(workflow_id: str, using: str) -> dict[str, Any] | None:
    """The fields ``result()`` reads of run ``workflow_id`` (``RESULT_FIELDS``), or None: no such run."""
    moments = {f"readable_{name}": readable(name) for name in _RESULT_MOMENTS}
    plain = [name for name in RESULT_FIELDS if name not in _RESULT_MOMENTS]
    found = Workflow.objects.using(using).filter(pk=workflow_id).values(*plain, **moments).first()
    if found is None:
        return None
    return {name: found[f"readable_{name}" if name in _RESULT_MOMENTS else name] for name in RESULT_FIELDS}


def read_start(workflow_id: str, using: str) -> tuple[str, datetime] | None:
    """(run id, created_at) of run ``workflow_id`` as the current transaction of ``using`` sees it
    (its own uncommitted writes included), or None: no such run."""
    found = Workflow.objects.using(using).filter(pk=workflow_id).values_list("run_id", "created_at").first()
    return None if found is None else (str(found[0]), found[1])


def read_end_on(reader: Any, workflow_id: str) -> dict[str, Any] | None:
    """As ``read_end``, on ``reader``: a psycopg connection of ``notify.open_reader`` (no Django)."""
    row = reader.execute(_RESULT_SQL, [*_RESULT_PARAMS, workflow_id]).fetchone()
    return None if row is None else dict(zip(RESULT_FIELDS, row, strict=True))


def delete_workflows(workflow_ids: list[str], using: str) -> None:
    """Delete these run rows, their other rows already deleted (purge): one statement (per chunk past
    the database's parameter limit), where the ORM's delete() would load every row to cascade to
    tables already emptied."""
    with connections[using].cursor() as cursor:
        for chunk in backend(using).chunks(workflow_ids):
            placeholders = ", ".join(["%s"] * len(chunk))
            cursor.execute(f"DELETE FROM {Workflow._meta.db_table} WHERE id IN ({placeholders})", chunk)


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


def claimable(now: datetime, using: str) -> bool:
    """Whether a run waits for an engine: a running workflow whose claim is unheld (and not backing
    off after being stuck), or a delayed start that is due.

    Args:
        now: workflow time (the database clock).
        using: the connection alias.
    """
    # runnable: the partial index weft_claim_free holds exactly these rows (no finished runs).
    unheld = WorkflowClaim.objects.using(using).filter(engine_id__isnull=True, runnable=True).values("workflow_id")
    runnable = Workflow.objects.using(using).filter(
        Q(stuck_retry_at__isnull=True) | Q(stuck_retry_at__lte=now),
        status=WorkflowStatus.RUNNING,
        id__in=unheld,
    )
    due_starts = Timer.objects.using(using).filter(kind=TimerKind.DELAYED_START, fire_at__lte=now)
    return runnable.exists() or due_starts.exists()


def cancelled_among(workflow_ids: list[str], using: str) -> set[str]:
    """Which of these workflows are cancelled.

    Args:
        workflow_ids: the workflows to look at.
        using: the connection alias.
    """
    rows = Workflow.objects.using(using).filter(status=WorkflowStatus.CANCELLED)
    chunks = backend(using).chunks(workflow_ids)
    return {wid for chunk in chunks for wid in rows.filter(id__in=chunk).values_list("id", flat=True)}


def run_of_unreadable(workflow_id: str, using: str) -> tuple[str, int] | None:
    """(run id, stuck attempts) of a workflow whose row the ORM cannot convert, read without the
    ORM's conversions; None when there is no such row or these two columns cannot be read either.

    Args:
        workflow_id: the workflow.
        using: the connection alias.

    Raises:
        DatabaseError: the database failed.
    """
    try:
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"SELECT run_id, stuck_attempts FROM {Workflow._meta.db_table} WHERE id = %s",
                [workflow_id],
            )
            row = cursor.fetchone()
    except DatabaseError:
        raise
    except Exception:
        return None
    if row is None:
        return None
    try:
        return str(uuid.UUID(str(row[0]))), int(row[1] or 0)
    except (ValueError, TypeError):
        return None


def complete_attempt(
    run_id: str, seq: int, attempt: int, epoch: int, result: str, completed_at: datetime, using: str
) -> bool:
    """Record an atomic activity's attempt as completed, inside the activity's own transaction (the
    caller locked the claim first). Returns whether the step still waited for this very attempt.

    Args:
        run_id: the run.
        seq: the step's position.
        attempt: the attempt number the step must still be running.
        epoch: the claim's epoch, recorded on the step.
        result: codec text of the activity's value.
        completed_at: when it completed (the database clock).
        using: the connection alias.
    """
    # error is left as it is: a step that succeeded on a retry keeps the last failed attempt's.
    done = (
        Step.objects.using(using)
        .filter(run_id=run_id, seq=seq, status=StepStatus.RUNNING, attempts=attempt)
        .update(status=StepStatus.COMPLETED, result=result, epoch=epoch, completed_at=completed_at)
    )
    return done == 1
