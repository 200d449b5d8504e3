"""The client: start runs, get handles, signal, describe, wait for results, and the transitions.

Clients write rows and send wake-ups; they never claim a workflow and never run one. ``start``,
``signal`` and the transitions join the caller's ``transaction.atomic()`` on the WEFT database and
take effect (wake-up included) when it commits. ``result`` waits for an engine, so it never joins
the caller's transaction: it runs on a "weft-wait" thread with its own autocommit connection.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, transaction
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce

from . import codec, events, notify, prepared, transitions, validation
from .clock import db_now, workflow_now_sql
from .conf import warn_if_invalid
from .epochs import next_epoch, next_epoch_sql
from .exceptions import (
    IdempotencyKeyPurgedError,
    InvalidArgumentError,
    InvalidWorkflowIdError,
    PayloadNotSerializableError,
    WorkflowAlreadyExistsError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowNotFoundError,
    WorkflowTerminalError,
    WorkflowTimedOutError,
)
from .models import (
    BufferedSignal,
    IdempotencyKey,
    Step,
    Timer,
    Workflow,
    WorkflowClaim,
)
from .queries_and_updates import admit, await_update, query_on_thread, update_on_thread
from .registry import WorkflowDefinition, resolve_workflow
from .status import TERMINAL_STATUSES, SignalState, TimerKind, WorkflowStatus
from .validation import (  # noqa: F401 - MAX_*: re-exported for the admin's forms
    MAX_ID_LENGTH,
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    validate_key,
    validate_name,
    validate_reason,
    validate_workflow_id,
)
from .waits import Wait, afinish, close_connections, finish, submit, wait_executor, wait_for_end

logger = logging.getLogger(__name__)

# The summary fields of describe(), in order (manage.py weft prints them in this order too).
SUMMARY_FIELDS = (
    "id",
    "status",
    "workflow_type",
    "version",
    "run_id",
    "owner_engine",
    "epoch",
    "claim_expires_at",
    "created_at",
    "started_at",
    "finished_at",
    "current_step",
    "pending_timers",
)

ON_CONFLICT = ("error", "use_existing", "start_new")
_UNSET: Any = object()


# ---------------------------------------------------------------------------------------- validation
#
# Every text, duration and moment is checked by weft_django.validation (NUL, lone surrogates, length,
# MAX_DURATION); the names below are kept for the modules that import them from here.

_validate_key = validate_key
_validate_name = validate_name
_duration = validation.duration


def _alias() -> str:
    from .conf import database_alias

    return database_alias()


def _encode_input(args: Any, kwargs: Any) -> str:
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise InvalidArgumentError(
            f"args must be a list or tuple of positional arguments (got {type(args).__name__}: "
            f"{args!r:.60}); for a single argument pass args=[value]."
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(key, str) for key in kwargs):
        raise InvalidArgumentError(f"kwargs must be a dict with str keys (got {kwargs!r:.60}).")
    value = {"args": list(args), "kwargs": dict(kwargs)}
    try:
        return codec.encode_payload(value, path="input")
    except PayloadNotSerializableError:
        # Name the bad part from the caller's point of view: args[1]['items'][3], not input['args'][1]...
        codec.encode(value["args"], path="args")
        codec.encode(value["kwargs"], path="kwargs")
        raise


def _start_time(start_after: Any, start_at: Any) -> timedelta | datetime | None:
    if start_after is not None and start_at is not None:
        raise InvalidArgumentError(
            "start_after and start_at are mutually exclusive: pass a delay (start_after) or a moment "
            "(start_at), not both."
        )
    if start_after is not None:
        return _duration(start_after, "start_after")
    if start_at is not None:
        return validation.start_moment(start_at)
    return None


# ------------------------------------------------------------------------------------------- start


class _Plan:
    """Everything a start writes, computed before the first query."""

    def __init__(
        self,
        definition: WorkflowDefinition,
        input_text: str,
        delay: timedelta | datetime | None,
        execution_timeout: timedelta | None,
        idempotency_key: str | None,
    ) -> None:
        self.definition = definition
        self.input_text = input_text
        self.delay = delay
        self.execution_timeout = execution_timeout
        self.idempotency_key = idempotency_key

    def workflow(self, workflow_id: str, now: datetime) -> tuple[Workflow, Timer | None]:
        begins = self.delay if isinstance(self.delay, datetime) else now + (self.delay or timedelta(0))
        delayed = begins > now
        if not delayed:
            begins = now
        run = Workflow(
            id=workflow_id,
            run_id=uuid.uuid4(),
            workflow_type=self.definition.name,
            version=self.definition.version,
            status=WorkflowStatus.PENDING if delayed else WorkflowStatus.RUNNING,
            input=self.input_text,
            idempotency_key=self.idempotency_key,
            start_at=begins if delayed else None,
            execution_deadline=begins + self.execution_timeout if self.execution_timeout is not None else None,
            created_at=now,
            updated_at=now,
            started_at=None if delayed else now,
        )
        timer = Timer(workflow_id=workflow_id, run_id=run.run_id, kind=TimerKind.DELAYED_START, fire_at=begins)
        return run, timer if delayed else None


def _now_and_epoch(using: str) -> tuple[datetime, int]:
    """Workflow time and a fresh epoch, in one round trip on PostgreSQL."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {workflow_now_sql('postgresql')}, {next_epoch_sql('postgresql')}")
            now, epoch = cursor.fetchone()
        return now, int(epoch)
    return db_now(using), next_epoch(using)


def _insert_run(plan: _Plan, workflow_id: str, using: str) -> None:
    """Insert a new run with its claim (fresh epoch, no holder) and its idempotency key, if any.

    IntegrityError when the id or the key is taken."""
    if _start_statement(plan, using) is not None:
        if not _insert_run_sql(plan, workflow_id, using):
            raise IntegrityError(f"workflow id {workflow_id!r} or idempotency key {plan.idempotency_key!r} is taken")
        return
    now, epoch = _now_and_epoch(using)
    run, timer = plan.workflow(workflow_id, now)
    if plan.idempotency_key is not None:
        # The key's primary key is where concurrent starts with one key meet: one insert wins, the
        # others wait for its transaction and fail, then find the winner's run.
        mapping = IdempotencyKey(key=plan.idempotency_key, workflow_id=workflow_id, run_id=run.run_id, created_at=now)
        mapping.save(using=using, force_insert=True)
    run.save(using=using, force_insert=True)
    transitions.write_claim(workflow_id, epoch, using)
    if timer is not None:
        timer.save(using=using, force_insert=True)
    notify.send("w", workflow_id, using)
    events.workflow_started(run, using)


def _try_insert_run(plan: _Plan, workflow_id: str, using: str) -> bool:
    """Insert a new run (as ``_insert_run``); False, with nothing written, when the id or key is taken.

    On PostgreSQL one statement that cannot fail on a taken id or key (no savepoint needed); elsewhere
    the ORM insert in a savepoint, so a taken id rolls back only that savepoint."""
    if _start_statement(plan, using) is not None:
        return _insert_run_sql(plan, workflow_id, using)
    try:
        with transaction.atomic(using=using):
            _insert_run(plan, workflow_id, using)
    except IntegrityError:
        return False
    return True


# The one-statement start (PostgreSQL). One round trip, and in autocommit one transaction: the clock,
# a fresh epoch, the idempotency key (if any), the run, its claim, its delayed-start timer (if any)
# and the wake-up. A taken id or key makes the statement insert nothing and return no row (ON CONFLICT
# DO NOTHING waits for a concurrent inserter's transaction, as a unique violation would), so it never
# raises for a conflict and never breaks the caller's transaction. Every data-modifying CTE runs once;
# the NOTIFY is delivered when the statement's (or the caller's) transaction commits.
_RUN_GIVEN = {"id", "run_id", "workflow_type", "version", "input", "idempotency_key"}
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
_start_statements: dict[tuple[str, bool, bool], tuple[str, dict[str, Any]] | None] = {}


def _start_statement(plan: _Plan, using: str) -> tuple[str, dict[str, Any]] | None:
    """The SQL and constant parameters of the one-statement start for this plan's shape, or None where
    it does not apply (not PostgreSQL, or a model with a column this statement does not know how to fill)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    delay = "none" if plan.delay is None else ("at" if isinstance(plan.delay, datetime) else "after")
    shape = (delay, plan.execution_timeout is not None, plan.idempotency_key is not None)
    if shape not in _start_statements:
        _start_statements[shape] = _build_start_statement(connection, *shape)
    return _start_statements[shape]


def _build_start_statement(
    connection: Any, delay: str, timeout: bool, keyed: bool
) -> tuple[str, dict[str, Any]] | None:
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
        "start_at": "NULL" if delay == "none" else f"CASE WHEN {delayed} THEN n.b END",
        "execution_deadline": "n.b + %(timeout)s::interval" if timeout else "NULL",
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
        f"l AS (INSERT INTO {WorkflowClaim._meta.db_table} "
        f"(workflow_id, epoch, engine_id, last_engine_id, claimed_at, expires_at, runnable, run_created_at) "
        f"SELECT w.id, n.e, NULL, NULL, NULL, NULL, TRUE, n.t FROM w, n ON CONFLICT (workflow_id) DO UPDATE SET "
        f"epoch = EXCLUDED.epoch, engine_id = NULL, last_engine_id = NULL, claimed_at = NULL, expires_at = NULL, "
        f"runnable = TRUE, run_created_at = EXCLUDED.run_created_at)"
        f"{timer_cte} "
        f"SELECT pg_notify('{notify.CHANNEL}', %(payload)s) FROM w"
    )
    return sql, constants


def _insert_run_sql(plan: _Plan, workflow_id: str, using: str) -> bool:
    """The one-statement start; whether the run was inserted (False: the id or the key is taken)."""
    statement = _start_statement(plan, using)
    assert statement is not None
    sql, constants = statement
    definition = plan.definition
    params = {
        **constants,
        "id": workflow_id,
        "run_id": uuid.uuid4(),
        "workflow_type": definition.name,
        "version": definition.version,
        "input": plan.input_text,
        "idempotency_key": plan.idempotency_key,
        "delay": plan.delay,
        "timeout": plan.execution_timeout,
        "payload": f"w:{workflow_id}",  # ids are at most 255 characters: always under notify.MAX_PAYLOAD
    }
    connection = connections[using]
    with connection.cursor() as cursor:
        prepared.execute(cursor, connection, sql, params)  # outside atomic(): prepared (planning > run)
        return events.started_if(cursor.fetchone() is not None, workflow_id, using)


def _replace_run(plan: _Plan, workflow_id: str, using: str) -> bool:
    """on_conflict="start_new": a new run over a terminal one. False when the id is free again."""
    existing = transitions.lock_workflow(workflow_id, using)
    if existing is None:
        return False
    _check_type(workflow_id, existing["workflow_type"], plan.definition)
    if existing["status"] not in TERMINAL_STATUSES:
        raise WorkflowAlreadyExistsError(
            f'Workflow "{workflow_id}" is still {existing["status"]}; on_conflict="start_new" replaces '
            f"only a finished run. Cancel it first, or use another id."
        )
    transitions.delete_run_rows([workflow_id], using)
    run, timer = plan.workflow(workflow_id, db_now(using))
    run.save(using=using, force_update=True)
    transitions.rotate_epoch(workflow_id, using)
    if timer is not None:
        timer.save(using=using, force_insert=True)
    notify.send("w", workflow_id, using)
    events.workflow_started(run, using)
    return True


def _check_type(workflow_id: str, existing_type: str, definition: WorkflowDefinition) -> None:
    if existing_type != definition.name:
        raise WorkflowAlreadyExistsError(
            f'Workflow "{workflow_id}" already exists as a "{existing_type}" run, not "{definition.name}". '
            f"Use another id."
        )


def _resolve_conflict(plan: _Plan, workflow_id: str, on_conflict: str, using: str) -> WorkflowHandle | None:
    """Apply ``on_conflict`` to an existing id; None when the id turned out to be free."""
    if on_conflict == "start_new":
        return WorkflowHandle(workflow_id) if _replace_run(plan, workflow_id, using) else None
    existing = Workflow.objects.using(using).filter(pk=workflow_id).values("workflow_type", "status").first()
    if existing is None:
        return None
    if on_conflict == "use_existing":
        _check_type(workflow_id, existing["workflow_type"], plan.definition)
        return WorkflowHandle(workflow_id)
    raise WorkflowAlreadyExistsError(
        f'Workflow "{workflow_id}" already exists ({existing["workflow_type"]}, {existing["status"]}). Pass '
        f'on_conflict="use_existing" to get its handle, on_conflict="start_new" to start a new run over a '
        f"finished one, or use another id."
    )


def _start_with_id(plan: _Plan, workflow_id: str, on_conflict: str, using: str) -> WorkflowHandle:
    for _ in range(transitions.MAX_ATTEMPTS):
        # The insert is the test for a taken id; a taken id writes nothing and leaves the caller's
        # transaction usable (_try_insert_run).
        if _try_insert_run(plan, workflow_id, using):
            return WorkflowHandle(workflow_id)
        handle = transitions.run_in_transaction(using, lambda: _resolve_conflict(plan, workflow_id, on_conflict, using))
        if handle is not None:
            return handle
    raise WorkflowAlreadyExistsError(  # pragma: no cover - the id was created and purged over and over
        f'Workflow "{workflow_id}" kept changing while it was being started; try again.'
    )


def _existing_for_key(key: str, definition: WorkflowDefinition, using: str) -> WorkflowHandle | None:
    mapping = IdempotencyKey.objects.using(using).filter(pk=key).first()
    if mapping is None:
        return None
    current = Workflow.objects.using(using).filter(pk=mapping.workflow_id).values("run_id", "workflow_type").first()
    if mapping.purged_at is not None or current is None or current["run_id"] != mapping.run_id:
        when = f" on {mapping.purged_at:%Y-%m-%d %H:%M:%S %Z}" if mapping.purged_at else ""
        raise IdempotencyKeyPurgedError(
            f'Idempotency key "{key}" started workflow "{mapping.workflow_id}", whose run was '
            f"purged{when} or replaced. Use a new key to start another run."
        )
    _check_type(mapping.workflow_id, current["workflow_type"], definition)
    return WorkflowHandle(mapping.workflow_id)


def _start_with_key(plan: _Plan, key: str, using: str) -> WorkflowHandle:
    if _start_statement(plan, using) is not None:
        # PostgreSQL: insert first (one statement; a taken key inserts nothing), then look the key up.
        for _ in range(transitions.MAX_ATTEMPTS):
            workflow_id = str(uuid.uuid4())
            if _insert_run_sql(plan, workflow_id, using):
                return WorkflowHandle(workflow_id)
            existing = _existing_for_key(key, plan.definition, using)
            if existing is not None:
                return existing
    for _ in range(transitions.MAX_ATTEMPTS):
        try:
            with transaction.atomic(using=using):
                existing = _existing_for_key(key, plan.definition, using)
                if existing is not None:
                    return existing
                workflow_id = str(uuid.uuid4())
                _insert_run(plan, workflow_id, using)
                return WorkflowHandle(workflow_id)
        except IntegrityError:
            continue
    raise WorkflowAlreadyExistsError(  # pragma: no cover
        f'Idempotency key "{key}" could not be resolved after {transitions.MAX_ATTEMPTS} attempts; try again.'
    )


def start(
    workflow: Any,
    /,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    id: str | None = None,
    idempotency_key: str | None = None,
    on_conflict: str = "error",
    start_after: Any = None,
    start_at: datetime | None = None,
    execution_timeout: Any = None,
) -> WorkflowHandle:
    """Start a run of ``workflow`` (the decorated function, its definition or its registered name).

    The new run is ``running`` with no owner until an engine claims it, or ``pending`` until
    ``start_after`` / ``start_at``. Joins the caller's transaction; the run exists once it commits.
    """
    if id is not None and idempotency_key is not None:
        raise InvalidArgumentError(
            "id and idempotency_key are mutually exclusive: with an idempotency key the workflow id is "
            "generated. Pass one of them."
        )
    if on_conflict not in ON_CONFLICT:
        raise InvalidArgumentError(f'on_conflict must be "error", "use_existing" or "start_new" (got {on_conflict!r}).')
    if id is not None:
        validate_workflow_id(id)
    if idempotency_key is not None:
        _validate_key(idempotency_key, "idempotency_key")
    delay = _start_time(start_after, start_at)
    timeout = (
        _duration(execution_timeout, "execution_timeout", positive=True) if execution_timeout is not None else None
    )
    definition = resolve_workflow(workflow)
    warn_if_invalid()  # issue 20: a WEFT typo is heard of here, not only when an engine refuses to start
    plan = _Plan(definition, _encode_input(args, kwargs), delay, timeout, idempotency_key)
    using = _alias()
    if idempotency_key is not None:
        return _start_with_key(plan, idempotency_key, using)
    if id is not None:
        return _start_with_id(plan, id, on_conflict, using)
    workflow_id = str(uuid.uuid4())
    if _start_statement(plan, using) is not None:
        _insert_run(plan, workflow_id, using)  # one statement: in autocommit, its own transaction
    else:
        with transaction.atomic(using=using):
            _insert_run(plan, workflow_id, using)
    return WorkflowHandle(workflow_id)


async def astart(workflow: Any, /, **options: Any) -> WorkflowHandle:
    """Async twin of :func:`start`."""
    return await sync_to_async(start)(workflow, **options)


def get_handle(id: str) -> WorkflowHandle:
    """A handle for workflow ``id``. Lazy: no query until it is used."""
    return WorkflowHandle(validate_workflow_id(id))


# ------------------------------------------------------------------------------------------ signal


def signal(id: str, name: str, payload: Any = None, *, signal_id: str | None = None) -> None:
    """Send signal ``name`` to the current run of workflow ``id``; durable once the caller commits.

    A repeated ``signal_id`` for the same run is a no-op (the new payload is ignored). Raises
    WorkflowTerminalError for a finished run and WorkflowNotFoundError for an unknown id.
    """
    validate_workflow_id(id)
    _validate_name(name, "name")
    if signal_id is not None:
        _validate_key(signal_id, "signal_id")
    text = codec.encode_payload(payload, path="payload")
    using = _alias()
    if connections[using].vendor == "postgresql":
        status = _buffer_signal(id, name, text, signal_id, using)  # one statement: atomic by itself
    else:
        with transaction.atomic(using=using):
            status = _buffer_signal(id, name, text, signal_id, using)
    if status is None:
        raise WorkflowNotFoundError(f'Cannot signal workflow "{id}": no such workflow. Check the id.')
    if status in TERMINAL_STATUSES:
        raise WorkflowTerminalError(
            f'Cannot signal workflow "{id}": it already ended ({status}), so nothing would receive "{name}".'
        )


def _buffer_signal(id: str, name: str, text: str, signal_id: str | None, using: str) -> str | None:
    """Append the signal to the current run's mailbox while that run is active and send the wake-up
    (on PostgreSQL one statement, the NOTIFY riding in it: delivered when it, or the caller's
    transaction, commits). Returns "buffered" (or "duplicate" for a repeated signal_id), else the
    run's terminal status, or None when there is no such workflow."""
    connection = connections[using]
    signals, workflows = BufferedSignal._meta.db_table, Workflow._meta.db_table
    active = [
        str(status.value) for status in (WorkflowStatus.PENDING, WorkflowStatus.RUNNING, WorkflowStatus.SUSPENDED)
    ]
    postgresql = connection.vendor == "postgresql"
    if postgresql:
        now_sql, now_params = workflow_now_sql("postgresql"), []
    else:
        now_sql, now_params = "%s", [connection.ops.adapt_datetimefield_value(db_now(using))]
    # No lock on the claim (a slow caller must never stall renewal); the row is appended to the
    # current run's mailbox only while that run is active. Table names are the models' own; every
    # value is a parameter.
    insert = (
        f"INSERT INTO {signals} (workflow_id, run_id, name, signal_id, payload, state, created_at) "
        f"SELECT w.id, w.run_id, %s, %s, %s, %s, {now_sql} FROM {workflows} w "
        f"WHERE w.id = %s AND w.status IN (%s, %s, %s) ON CONFLICT DO NOTHING"
    )
    params = [name, signal_id, text, str(SignalState.BUFFERED.value), *now_params, id, *active]
    with connection.cursor() as cursor:
        if postgresql:
            wake = f"w:{id}" if len(id) < notify.MAX_PAYLOAD - 2 else "w:*"
            prepared.execute(
                cursor,
                connection,
                f"WITH s AS ({insert} RETURNING workflow_id) SELECT pg_notify(%s, %s) FROM s",
                [*params, notify.CHANNEL, wake],
            )
            inserted = len(cursor.fetchall()) == 1
        else:
            cursor.execute(insert, params)
            inserted = cursor.rowcount == 1
    if not inserted:
        status = Workflow.objects.using(using).filter(pk=id).values_list("status", flat=True).first()
        if status is None or status in TERMINAL_STATUSES:
            return status
        return "duplicate"  # a repeated signal_id: already buffered for this run
    return "buffered"  # (SQLite has no wake-ups: engines poll)


def cancel(id: str, reason: str | None = None) -> None:
    """Cancel workflow ``id`` (see WorkflowHandle.cancel)."""
    WorkflowHandle(id).cancel(reason)


# ---------------------------------------------------------------------------------------- messages
#
# query() and update() wait for an engine, so (like result()) they run on a weft-wait thread with
# their own autocommit connection and never join the caller's transaction. Answers wake them through
# "a:<request id>" on PostgreSQL (the shared LISTEN connection); elsewhere they poll.


def query(id: str, name: str, arg: Any = _UNSET, *, timeout: Any = "5s") -> Any:
    """Ask workflow ``id`` a question; the engine that holds it answers from its live context:
    ``activity_progress`` (built in), then the query handler (called with ``arg`` when given, with no
    argument otherwise), then the exposed accessor.

    Returns None for a finished run. Raises WorkflowNotFoundError (unknown id), QueryNotFoundError
    (no such query), QueryFailedError (the handler raised; ``.error``) and QueryTimeoutError (no
    answer within ``timeout``, saying why: no engine holds the run, it is suspended, ...)."""
    return finish(*_submit_query(id, name, arg, timeout))


def update(id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s") -> Any:
    """Send update ``name`` to workflow ``id`` and return its handler's result.

    Durable from admission. The owning engine runs the validator, then the handler, and answers.
    Raises UpdateValidationError (``.issues``; the run is unchanged), UpdateFailedError (the handler
    or validator raised; ``.error``; the run goes on), UpdateTimeoutError (not applied within
    ``timeout``: the request is marked expired and never applied), WorkflowTerminalError and
    WorkflowNotFoundError. A repeated ``idempotency_key`` (per run) returns the stored response and
    applies once; after a timeout it re-admits the request."""
    return finish(*_submit_update(id, name, payload, idempotency_key, timeout))


async def aquery(id: str, name: str, arg: Any = _UNSET, *, timeout: Any = "5s") -> Any:
    """Async twin of :func:`query` (the wait runs on a weft-wait thread, not the event loop)."""
    return await afinish(*_submit_query(id, name, arg, timeout))


async def aupdate(
    id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s"
) -> Any:
    """Async twin of :func:`update`."""
    return await afinish(*_submit_update(id, name, payload, idempotency_key, timeout))


def start_or_signal(
    workflow: Any,
    signal_name: str,
    payload: Any = None,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    id: str,
    signal_id: str | None = None,
) -> tuple[WorkflowHandle, str]:
    """Signal run ``id``, starting it first if it is absent or finished (as ``on_conflict="start_new"``),
    in one transaction. Returns ``(handle, "started" | "signalled")``. A run of another workflow type
    under ``id`` raises WorkflowAlreadyExistsError. Joins the caller's transaction, like ``start``."""
    validate_workflow_id(id)
    _validate_name(signal_name, "signal_name")
    if signal_id is not None:
        _validate_key(signal_id, "signal_id")
    text = codec.encode_payload(payload, path="payload")
    plan = _Plan(resolve_workflow(workflow), _encode_input(args, kwargs), None, None, None)
    using = _alias()

    def deliver(started: bool) -> bool:
        status = _buffer_signal(id, signal_name, text, signal_id, using)
        return status in ("buffered", "duplicate")  # else the run ended meanwhile: go round

    outcome = _with_run(plan, id, using, deliver)
    return WorkflowHandle(id), "started" if outcome else "signalled"


def start_with_update(
    workflow: Any,
    update_name: str,
    payload: Any = None,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    id: str,
    idempotency_key: str | None = None,
    timeout: Any = "5s",
) -> tuple[WorkflowHandle, Any]:
    """Send update ``update_name`` to run ``id``, starting it first if it is absent or finished, with
    the start and the update's admission in one transaction; then wait for the update's result.
    Returns ``(handle, result)``; the errors are those of :func:`update` and WorkflowAlreadyExistsError
    for a run of another type. Waits, so it uses its own connection (never the caller's transaction)."""
    validate_workflow_id(id)
    _validate_name(update_name, "update_name")
    if idempotency_key is not None:
        _validate_key(idempotency_key, "idempotency_key")
    seconds = _wait_seconds(timeout)
    text = codec.encode_payload(payload, path="payload")
    plan = _Plan(resolve_workflow(workflow), _encode_input(args, kwargs), None, None, None)
    future, abandoned = submit(
        _start_with_update_on_thread, plan, id, update_name, text, idempotency_key, seconds, _alias()
    )
    return WorkflowHandle(id), finish(future, abandoned)


def _with_run(plan: _Plan, workflow_id: str, using: str, deliver: Any) -> bool:
    """In one transaction: start run ``workflow_id`` if it is absent or finished, then ``deliver(started)``.
    Returns whether a run was started. ``deliver`` returns False when the run ended in between."""
    for _ in range(transitions.MAX_ATTEMPTS):
        with transaction.atomic(using=using):
            started = _try_insert_run(plan, workflow_id, using)
            if not started:
                existing = (
                    Workflow.objects.using(using).filter(pk=workflow_id).values("workflow_type", "status").first()
                )
                if existing is None:
                    continue  # purged meanwhile: insert again
                _check_type(workflow_id, existing["workflow_type"], plan.definition)
                started = existing["status"] in TERMINAL_STATUSES
                if started and not _replace_run(plan, workflow_id, using):
                    continue
            if deliver(started):
                return started
    raise WorkflowAlreadyExistsError(  # pragma: no cover - the run kept ending and restarting
        f'Workflow "{workflow_id}" kept changing while it was being started; try again.'
    )


def _wait_seconds(timeout: Any) -> float:
    if timeout is None:
        raise InvalidArgumentError(
            'timeout must be a positive duration such as "5s" (got None): query() and update() always wait '
            "a bounded time."
        )
    return _duration(timeout, "timeout", positive=True).total_seconds()


def _submit_query(id: str, name: str, arg: Any, timeout: Any) -> tuple[Any, threading.Event]:
    validate_workflow_id(id)
    _validate_name(name, "name")
    seconds = _wait_seconds(timeout)
    arg_text = None if arg is _UNSET else codec.encode_payload(arg, path="arg")
    return submit(query_on_thread, id, name, arg is not _UNSET, arg_text, seconds, _alias())


def _submit_update(
    id: str, name: str, payload: Any, idempotency_key: str | None, timeout: Any
) -> tuple[Any, threading.Event]:
    validate_workflow_id(id)
    _validate_name(name, "name")
    if idempotency_key is not None:
        _validate_key(idempotency_key, "idempotency_key")
    seconds = _wait_seconds(timeout)
    text = codec.encode_payload(payload, path="payload")
    return submit(update_on_thread, id, name, text, idempotency_key, seconds, _alias())


def _start_with_update_on_thread(
    plan: _Plan,
    workflow_id: str,
    name: str,
    text: str,
    key: str | None,
    seconds: float,
    alias: str,
    abandoned: threading.Event,
) -> Any:
    with Wait(alias, seconds, abandoned) as wait:
        wait.subscribe(workflow_id)
        admitted: list[str] = []

        def deliver(started: bool) -> bool:
            admitted.append(admit(workflow_id, name, text, key, wait, alias))
            return True

        for attempt in range(transitions.MAX_ATTEMPTS):
            try:
                _with_run(plan, workflow_id, alias, deliver)
                break
            except IntegrityError:
                admitted.clear()
                if attempt == transitions.MAX_ATTEMPTS - 1:
                    raise
        return await_update(workflow_id, name, admitted[-1], wait)


# ------------------------------------------------------------------------------------------ result


def _outcome(workflow_id: str, row: dict[str, Any]) -> Any:
    status = row["status"]
    if status == WorkflowStatus.COMPLETED:
        return codec.decode(row["result"])
    if status == WorkflowStatus.FAILED:
        error = row["error"] if isinstance(row["error"], dict) else {}
        raise WorkflowFailedError(
            f'Workflow "{workflow_id}" failed: {error.get("type", "Error")}: {error.get("message", "")}',
            error,
        )
    if status == WorkflowStatus.CANCELLED:
        reason = f": {row['cancel_reason']}" if row["cancel_reason"] else ""
        raise WorkflowCancelledError(f'Workflow "{workflow_id}" was cancelled{reason}.')
    raise WorkflowTimedOutError(
        f'Workflow "{workflow_id}" timed out: its execution deadline ({row["execution_deadline"]}) passed.'
    )


def _deadline(timeout: Any) -> float | None:
    if timeout is None:
        return None
    return time.monotonic() + _duration(timeout, "timeout").total_seconds()


# ------------------------------------------------------------------------------------------ handle


def _status(stored: str) -> WorkflowStatus | str:
    try:
        return WorkflowStatus(stored)
    except ValueError:
        return stored  # an odd row: shown as stored (the admin and `weft describe` mark it)


class WorkflowHandle:
    """A reference to workflow ``id`` (its latest run). Cheap: every method reads or writes fresh.

    ``id`` is checked as ``weft.start`` checks it: InvalidWorkflowIdError for an id no run can have."""

    __slots__ = ("id",)

    def __init__(self, id: str) -> None:
        self.id = validate_workflow_id(id)

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.id!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkflowHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash((WorkflowHandle, self.id))

    @property
    def status(self) -> WorkflowStatus | str:
        """The run's status, read from the database now (the stored text when it is not a
        WorkflowStatus: a row written by hand or by another version)."""
        status = Workflow.objects.using(_alias()).filter(pk=self.id).values_list("status", flat=True).first()
        if status is None:
            raise WorkflowNotFoundError(f'No workflow "{self.id}" exists (never started, or purged).')
        return _status(status)

    def describe(self) -> dict[str, Any]:
        """id, status, workflow_type, version, run_id, owner_engine, epoch, claim_expires_at,
        created_at, started_at, finished_at, current_step, pending_timers (one query).

        ``status`` is a WorkflowStatus, or the stored text for a status weft does not know (an odd
        row). Raises WorkflowNotFoundError for an unknown id."""
        using = _alias()
        claim = WorkflowClaim.objects.using(using).filter(pk=OuterRef("pk"))
        last_step = Step.objects.using(using).filter(run_id=OuterRef("run_id")).order_by("-seq")
        timers = (
            Timer.objects.using(using)
            .filter(workflow_id=OuterRef("pk"))
            .order_by()
            .values("workflow_id")
            .annotate(n=Count("pk"))
            .values("n")
        )
        row = (
            Workflow.objects.using(using)
            .filter(pk=self.id)
            .annotate(
                owner_engine=Subquery(claim.values("engine_id")[:1]),
                epoch=Subquery(claim.values("epoch")[:1]),
                claim_expires_at=Subquery(claim.values("expires_at")[:1]),
                pending_timers=Coalesce(Subquery(timers, output_field=IntegerField()), 0),
                last_seq=Subquery(last_step.values("seq")[:1]),
                last_kind=Subquery(last_step.values("kind")[:1]),
                last_name=Subquery(last_step.values("name")[:1]),
            )
            .values(
                *SUMMARY_FIELDS,
                "last_seq",
                "last_kind",
                "last_name",
            )
            .first()
        )
        if row is None:
            raise WorkflowNotFoundError(f'No workflow "{self.id}" exists (never started, or purged).')
        described: dict[str, Any] = dict(row)
        last_seq, last_kind, last_name = (described.pop(key) for key in ("last_seq", "last_kind", "last_name"))
        if not described["current_step"]:
            described["current_step"] = (
                None if last_seq is None else f"#{last_seq} {last_kind}" + (f" {last_name}" if last_name else "")
            )
        described["status"] = _status(described["status"])
        return described

    def signal(self, name: str, payload: Any = None, *, signal_id: str | None = None) -> None:
        """Send a signal (see :func:`signal`)."""
        signal(self.id, name, payload, signal_id=signal_id)

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the run, storing ``reason`` (None, or a str of at most 1000 characters) with it.

        Raises InvalidArgumentError for a bad reason (nothing is written), WorkflowTerminalError if the
        run already ended and WorkflowNotFoundError for an unknown id."""
        transitions.cancel(self.id, validate_reason(reason), using=_alias())

    def suspend(self) -> None:
        """running -> suspended; WorkflowStateError otherwise."""
        transitions.suspend(self.id, using=_alias())

    def resume(self) -> None:
        """suspended -> running; WorkflowStateError otherwise."""
        transitions.resume(self.id, using=_alias())

    def retry(self) -> None:
        """failed -> running, same run_id, from its last checkpoint; WorkflowStateError otherwise."""
        transitions.retry(self.id, using=_alias())

    def query(self, name: str, arg: Any = _UNSET, *, timeout: Any = "5s") -> Any:
        """Ask the run a question (see :func:`query`)."""
        return query(self.id, name, arg, timeout=timeout)

    def update(self, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s") -> Any:
        """Send an update and return its handler's result (see :func:`update`)."""
        return update(self.id, name, payload, idempotency_key=idempotency_key, timeout=timeout)

    def _submit_wait(self, timeout: Any) -> tuple[Any, threading.Event]:
        deadline = _deadline(timeout)
        abandoned = threading.Event()
        future = wait_executor().submit(wait_for_end, self.id, _alias(), deadline, abandoned)
        return future, abandoned

    def result(self, timeout: Any = None) -> Any:
        """Wait until the run ends; return its value or raise WorkflowFailedError,
        WorkflowCancelledError or WorkflowTimedOutError.

        ``timeout`` (a duration up to ``durations.MAX_DURATION``, None: no limit) running out first
        raises WaitTimeoutError, which is also a builtin TimeoutError. A bad ``timeout`` raises
        InvalidArgumentError. Reads committed data only, on its own connection."""
        future, abandoned = self._submit_wait(timeout)
        try:
            row = future.result()
        finally:
            abandoned.set()
        return _outcome(self.id, row)

    async def aresult(self, timeout: Any = None) -> Any:
        future, abandoned = self._submit_wait(timeout)
        try:
            row = await asyncio.wrap_future(future)
        finally:
            abandoned.set()
        return _outcome(self.id, row)

    async def adescribe(self) -> dict[str, Any]:
        return await sync_to_async(self.describe)()

    async def asignal(self, name: str, payload: Any = None, *, signal_id: str | None = None) -> None:
        await sync_to_async(self.signal)(name, payload, signal_id=signal_id)

    async def acancel(self, reason: str | None = None) -> None:
        await sync_to_async(self.cancel)(reason)

    async def asuspend(self) -> None:
        await sync_to_async(self.suspend)()

    async def aresume(self) -> None:
        await sync_to_async(self.resume)()

    async def aretry(self) -> None:
        await sync_to_async(self.retry)()

    async def aquery(self, name: str, arg: Any = _UNSET, *, timeout: Any = "5s") -> Any:
        return await aquery(self.id, name, arg, timeout=timeout)

    async def aupdate(
        self, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s"
    ) -> Any:
        return await aupdate(self.id, name, payload, idempotency_key=idempotency_key, timeout=timeout)


__all__ = [
    "InvalidArgumentError",
    "InvalidWorkflowIdError",
    "WorkflowHandle",
    "aquery",
    "astart",
    "aupdate",
    "cancel",
    "close_connections",
    "get_handle",
    "query",
    "signal",
    "start",
    "start_or_signal",
    "start_with_update",
    "update",
]
