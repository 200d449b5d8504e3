"""Loading what an engine needs to resume workflows: runs, steps, applied updates, timers, admitted
updates, and the buffered signals and claim holders of the workflows it drives.

The records a history is made of (``StepRecord``, ``AppliedRecord``, ``Outcome``) are defined here,
below the engine: the driver replays them, the loader reads them, the fenced commit writes them.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from django.db import DatabaseError, DataError, connections

from ..models import AppliedUpdate, BufferedSignal, ContinuedRun, PendingUpdate, Step, Timer, Workflow, WorkflowClaim
from ..status import SignalState, UpdateStatus
from . import prepared
from .backend import backend
from .damaged_rows import UnreadableRow, check_timer, number, uuid_text
from .mailbox import BUFFERED_STATE_SQL
from .notify import BufferedRow

# -- client side (start, handles, transitions, schedules, testing) --------------------------


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How an operation settled: its value as codec text, or the error to throw into the workflow."""

    ok: bool
    text: str | None = None  # codec text of the value when ok
    error: dict[str, Any] | None = None  # an exception to throw into the workflow when not ok


@dataclasses.dataclass
class StepRecord:
    """One row of a run's step log, as the driver replays it and the fenced commit writes it."""

    seq: int
    kind: str
    name: str
    status: str  # running | completed | failed
    result: str | None = None
    error: dict[str, Any] | None = None
    attempts: int = 0
    started_at: datetime | None = None
    completed_at: datetime | None = None

    @property
    def settled(self) -> bool:
        return self.status in ("completed", "failed")

    @property
    def outcome(self) -> Outcome:
        return Outcome(ok=self.status == "completed", text=self.result, error=self.error)


@dataclasses.dataclass(frozen=True)
class AppliedRecord:
    """An update handler that ran on a live context: replay re-applies it at ``seq`` (the frontier it
    arrived at), in ``n`` order, without its validator, before that yield's result is fed."""

    seq: int
    n: int
    name: str
    payload: str  # codec text
    result: str | None = None
    error: dict[str, Any] | None = None
    update_id: str | None = None


class RunRow(NamedTuple):
    """The columns of a claimed run the engine reads to start driving it (a Workflow row, without
    building a model instance per run: loading runs is on the claim path of every tick)."""

    id: str
    run_id: str
    workflow_type: str
    version: str
    status: str
    input: str
    started_at: datetime | None
    execution_deadline: datetime | None
    stuck_error: Any
    stuck_attempts: int
    parent_id: str | None
    parent_run_id: str | None
    parent_seq: int | None
    depth: int
    trace_context: str | None = None  # the starter's (weft_django.tracing)
    fork_origin: Any = None  # weft.fork's deterministic.Lineage (JSON), or None
    continued: bool = False  # a later run of its workflow id (continued as new, or started over one): _CONTINUED_SQL


class AdmittedRow(NamedTuple):
    """An admitted update as deliver_updates reads it: ids as strings, in (created_at, id) order."""

    id: str
    workflow_id: str
    run_id: str
    name: str


class KnownMailbox(NamedTuple):
    """A workflow's mailbox as one read saw it: the highest signal id its snapshot saw (``top``; no
    signal above it was visible) and the buffered signals, oldest first."""

    top: int
    rows: list[BufferedRow]


class Loaded(NamedTuple):
    """What the engine reads to start driving freshly claimed workflows (``load``)."""

    runs: dict[str, RunRow]  # workflow id -> its current run
    steps: dict[str, dict[int, StepRecord]]  # run id -> {seq: step}
    applied: dict[str, list[AppliedRecord]]  # run id -> the updates replay re-applies
    timers: dict[str, list[Timer]]  # workflow id -> its timers
    admitted: dict[str, list[AdmittedRow]] | None  # workflow id -> admitted updates; None: not read
    # workflow id -> (the highest signal id the read's snapshot saw, its buffered signals); None: not
    # read (engine/signal_delivery.py: a loaded context knows its mailbox without reading it again)
    signals: dict[str, KnownMailbox] | None = None


# Column lists and the row decoders are shared by both vendors' paths (one statement batch on
# PostgreSQL, separate queries on SQLite), so the two cannot drift.
_RUN_COLUMNS = ", ".join(RunRow._fields[:-1])
# RunRow.continued: whether this run is a later run of its workflow id, whose children get run-qualified
# default ids (engine/owned.default_child_id): a ContinuedRun row names it as the next one (a unique
# index), or a stored workflow is a child of this id started by another run (a run started over a
# finished one with on_conflict="start_new": the old run's children keep their ids <id>/<seq>, so
# this run's would collide with them) or is already a run-qualified child of this run (it stays so
# once an earlier run's children are purged: a retried child step finds its own child again). That
# last test, <id>/<anything>/<seq>, compares prefix and suffix: a LIKE pattern made of the id read the
# id's own % _ and (PostgreSQL) backslash as pattern characters.
_W = Workflow._meta.db_table
_SEQ = "('/' || k.parent_seq)"
_CONTINUED_SQL = (
    f"(EXISTS (SELECT 1 FROM {ContinuedRun._meta.db_table} c WHERE c.next_run_id = {_W}.run_id) "
    f"OR EXISTS (SELECT 1 FROM {_W} k WHERE k.parent_id = {_W}.id AND (k.parent_run_id <> {_W}.run_id "
    f"OR (substr(k.id, 1, length({_W}.id) + 1) = {_W}.id || '/' "
    f"AND length(k.id) >= length({_W}.id) + 1 + length{_SEQ} "
    f"AND substr(k.id, length(k.id) - length{_SEQ} + 1) = {_SEQ}))))"
)
_STEP_COLUMNS = "run_id, seq, kind, name, status, result, error, attempts, started_at, completed_at"
_APPLIED_COLUMNS = "run_id, seq, n, name, payload, result, error, update_id"
_TIMER_FIELDS = [field.attname for field in Timer._meta.concrete_fields]  # Timer.from_db's positional order
_TIMER_COLUMNS = ", ".join(str(field.column) for field in Timer._meta.concrete_fields)
_ADMITTED_COLUMNS = "id, workflow_id, run_id, name"
_Aware = Callable[[Any], "datetime | None"]


# The builders below take what follows the id (or run id) column in their WHERE clause: ``IN (%s, %s)``
# (a chunk's placeholders), ``IN (<a subquery>)`` or ``= ANY(<an array>)``.


def _runs_sql(ids: str) -> str:
    return f"SELECT {_RUN_COLUMNS}, {_CONTINUED_SQL} FROM {Workflow._meta.db_table} WHERE id {ids}"


def _steps_sql(runs: str) -> str:
    return f"SELECT {_STEP_COLUMNS} FROM {Step._meta.db_table} WHERE run_id {runs}"


def _applied_sql(runs: str) -> str:
    return f"SELECT {_APPLIED_COLUMNS} FROM {AppliedUpdate._meta.db_table} WHERE run_id {runs} ORDER BY seq, n"


def _timers_sql(ids: str) -> str:
    return f"SELECT {_TIMER_COLUMNS} FROM {Timer._meta.db_table} WHERE workflow_id {ids}"


def _admitted_sql(ids: str) -> str:
    return (
        f"SELECT {_ADMITTED_COLUMNS} FROM {PendingUpdate._meta.db_table} "
        f"WHERE workflow_id {ids} AND status = %s ORDER BY created_at, id"
    )


_SIGNALS = BufferedSignal._meta.db_table


def _signals_sql(ids: str) -> str:
    """The mailbox read, and the highest signal id its snapshot sees (``top``: a LEFT JOIN, so a row
    comes back even when no signal is buffered; ``max(id)`` is one step down the primary key; 0: none
    at all)."""
    return (
        f"SELECT m.top, s.id, s.workflow_id, s.run_id, s.name, s.payload, s.trace_context "
        f"FROM (SELECT COALESCE(max(id), 0) AS top FROM {_SIGNALS}) AS m LEFT JOIN {_SIGNALS} AS s "
        f"ON s.{BUFFERED_STATE_SQL} AND s.workflow_id {ids} ORDER BY s.id"
    )


_BUFFERED_SQL = _signals_sql("= ANY(%s)")


def buffered_signals(workflow_ids: list[str], using: str) -> tuple[list[BufferedRow], int | None]:
    """The buffered signals of these workflows, oldest first: (id, workflow id, run id, name, payload,
    trace context); and, where the backend prepares statements (PostgreSQL, one prepared statement:
    a signal's wake-up pass runs it), the highest signal id the read's snapshot saw, else None.
    No signal above that id was visible to the read, so none above it can have been consumed before
    it: engine/signal_delivery.py relies on that to use a signal an ``S:`` wake-up carried.

    Args:
        workflow_ids: the workflows to read the mailbox of.
        using: the connection alias.
    """
    found = backend(using)
    if not found.prepares_statements:
        signals = BufferedSignal.objects.using(using).filter(state=SignalState.BUFFERED).order_by("id")
        rows = [
            row
            for chunk in found.chunks(workflow_ids)
            for row in signals.filter(workflow_id__in=chunk).values_list(
                "id", "workflow_id", "run_id", "name", "payload", "trace_context"
            )
        ]
        return sorted(rows, key=lambda row: row[0]), None
    connection = connections[using]
    with connection.cursor() as cursor:
        prepared.execute(cursor, connection, _BUFFERED_SQL, [workflow_ids])
        found = cursor.fetchall()
    top = found[0][0] if found else None
    return [tuple(row[1:]) for row in found if row[1] is not None], top


def buffered_names(workflow_ids: list[str], names: set[str], using: str) -> list[tuple[str, str, str]]:
    """(workflow id, run id as text, name) of the buffered signals (or child-terminal records) of
    these workflows whose name is one of ``names`` (a record of an earlier run of the workflow waits
    for the mailbox sweep, not for the current run).

    Args:
        workflow_ids: the workflows to look at.
        names: the signal names (mailbox names) of interest.
        using: the connection alias.
    """
    found = backend(using)
    signals = BufferedSignal.objects.using(using).filter(state=SignalState.BUFFERED, name__in=names)
    return [
        (wid, _uuid_text(run_id), name)
        for chunk in found.chunks(workflow_ids, reserved=len(names) + 10)
        for wid, run_id, name in signals.filter(workflow_id__in=chunk).values_list("workflow_id", "run_id", "name")
    ]


def claim_holders(workflow_ids: list[str], using: str) -> dict[str, tuple[int, str | None]]:
    """The current (epoch, holding engine id) of these workflows' claims, by workflow id (absent: no
    claim row).

    Args:
        workflow_ids: the workflows whose claims to read.
        using: the connection alias.
    """
    claims = WorkflowClaim.objects.using(using)
    return {
        wid: (epoch, holder)
        for chunk in backend(using).chunks(workflow_ids)
        for wid, epoch, holder in claims.filter(workflow_id__in=chunk).values_list("workflow_id", "epoch", "engine_id")
    }


def _uuid_text(value: Any) -> str:
    return str(uuid.UUID(str(value)))  # uuid on PostgreSQL, hex text on SQLite


def _rows(cursor: Any) -> list[Any]:
    """``cursor.fetchall()``, a value the driver cannot convert raised as ``UnreadableRow``."""
    try:
        return list(cursor.fetchall())
    # PostgreSQL: the result set is already in memory, only a conversion can fail here. SQLite: its
    # converters (Django's) raise ValueError for a malformed date (a year 0, a month 13).
    except (DataError, ValueError) as exc:
        raise UnreadableRow(f"{exc} (a value the database holds but Python cannot represent)") from exc


def _required(value: datetime | None, what: str) -> datetime:
    """A NOT NULL timestamp as read: None only when SQLite holds a value Django does not parse (a
    number, text of another shape), which the engine must not take for a time."""
    if value is None:
        raise UnreadableRow(f"{what} holds a value that is not a time (written by hand?)")
    return value


def _decode_runs(values: list[Any], aware: _Aware, into: dict[str, RunRow]) -> None:
    for columns in values:
        row = RunRow(*columns)
        into[row.id] = RunRow(  # built once more, positionally (``_replace`` goes through a dict)
            row.id,
            _uuid_text(row.run_id),
            row.workflow_type,
            row.version,
            row.status,
            row.input,
            aware(row.started_at),
            aware(row.execution_deadline),
            _json_value(row.stuck_error),
            row.stuck_attempts,
            row.parent_id,
            _uuid_text(row.parent_run_id) if row.parent_run_id else None,
            row.parent_seq,
            row.depth,
            row.trace_context,
            _json_value(row.fork_origin),
            bool(row.continued),
        )


def _decode_steps(values: list[Any], aware: _Aware, into: dict[str, dict[int, StepRecord]]) -> None:
    for run_id, seq, kind, name, status, result, error, attempts, started, completed in values:
        steps = into.get(_uuid_text(run_id))
        if steps is None:  # a run that began after the runs were read (PostgreSQL: a later statement)
            continue
        seq = number(seq, f"a step ({kind} {name!r}) of run {_uuid_text(run_id)}: its seq")
        attempts = number(attempts, f"step {seq} of run {_uuid_text(run_id)}: its attempts")
        started = _required(aware(started), f"step {seq}'s started_at")
        steps[seq] = StepRecord(
            seq, kind, name, status, result, _json_value(error), attempts, started, aware(completed)
        )


def _decode_applied(values: list[Any], into: dict[str, list[AppliedRecord]]) -> None:
    for run_id, seq, n, name, payload, result, error, update_id in values:
        where = f"update {name!r} applied to run {_uuid_text(run_id)}"
        seq, n = number(seq, f"{where}: its seq"), number(n, f"{where}: its n")
        if update_id:
            update_id = uuid_text(update_id, f"{where} at step {seq}: its update_id")
        record = AppliedRecord(seq, n, name, payload, result, _json_value(error), update_id or None)
        into.setdefault(_uuid_text(run_id), []).append(record)


def _decode_timers(values: list[Any], aware: _Aware, using: str, into: dict[str, list[Timer]]) -> None:
    """Timer instances as the ORM builds them (no query: from_db marks them saved, on ``using``)."""
    for columns in values:
        fields = dict(zip(_TIMER_FIELDS, columns, strict=True))
        check_timer(fields)  # a kind weft never writes, a step timer with no step: that workflow is stuck
        if fields["run_id"]:
            fields["run_id"] = uuid.UUID(uuid_text(fields["run_id"], f"timer {fields['id']!r}: its run_id"))
        fields["fire_at"] = _required(aware(fields["fire_at"]), "a timer's fire_at")
        timer = Timer.from_db(using, _TIMER_FIELDS, [fields[name] for name in _TIMER_FIELDS])
        into.setdefault(timer.workflow_id, []).append(timer)


def _decode_admitted(values: list[Any], into: dict[str, list[AdmittedRow]]) -> None:
    for pk, wid, run_id, name in values:
        into.setdefault(wid, []).append(AdmittedRow(_uuid_text(pk), wid, _uuid_text(run_id), name))


def _decode_signals(values: list[Any], workflow_ids: list[str], into: dict[str, KnownMailbox]) -> None:
    if not values:
        return
    mailboxes = {wid: KnownMailbox(values[0][0], []) for wid in workflow_ids}
    for row in values:
        if row[1] is not None and row[2] in mailboxes:
            mailboxes[row[2]].rows.append(tuple(row[1:]))
    into.update(mailboxes)


def load(workflow_ids: list[str], using: str) -> Loaded:
    """Everything needed to start driving these claimed workflows. Where the backend batches
    statements (PostgreSQL, with psycopg 3 binding parameters client-side, Django's default) one
    round trip per chunk of ids: runs, steps, applied updates, timers, buffered signals (with the
    highest signal id the read saw) and admitted updates in one ``execute``. Elsewhere one query
    each, and signals and admitted updates are left to the engine's first look (``signals`` and
    ``admitted`` are None).

    Args:
        workflow_ids: the claimed workflows.
        using: the connection alias.

    Raises:
        DatabaseError: the database failed; any other exception: a row could not be converted.
    """
    if workflow_ids and backend(using).batches_statements:
        with connections[using].cursor() as cursor:
            if _client_binding(cursor):
                return _load_batched(cursor, workflow_ids, using)
    runs = load_runs(workflow_ids, using)
    run_ids = [row.run_id for row in runs.values()]
    steps, applied = load_steps(run_ids, using), load_applied(run_ids, using)
    return Loaded(runs, steps, applied, load_timers(workflow_ids, using), None)


def _client_binding(cursor: Any) -> bool:
    """Whether this cursor takes several statements in one execute and returns each result set:
    psycopg 3's ClientCursor (OPTIONS server_side_binding off). Not a server-side-binding cursor
    (one statement per prepared query), not psycopg2 (its nextset() is not supported)."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - Django on psycopg2
        return False
    return isinstance(getattr(cursor, "cursor", None), psycopg.ClientCursor)


def load_sql(ids: str) -> str:
    """The six statements of PostgreSQL's load in one query string (runs, steps, applied updates,
    timers, buffered signals, admitted updates) for the workflows ``ids`` names: ``IN (%s, %s)`` or ``= ANY(<an
    array>)`` (``store/claims/taking.py``: the ids its claim statement just took). Parameters: the ids
    once per statement where ``ids`` has placeholders, then the admitted status."""
    return ";\n".join(load_statements(ids))


def load_statements(ids: str) -> list[str]:
    """``load_sql``'s six statements, one string each (``store/claims/taking.py`` prepares them)."""
    of_runs = f"IN (SELECT run_id FROM {Workflow._meta.db_table} WHERE id {ids})"
    return [
        _runs_sql(ids),
        _steps_sql(of_runs),
        _applied_sql(of_runs),
        _timers_sql(ids),
        _signals_sql(ids),
        _admitted_sql(ids),
    ]


ADMITTED_PARAM = UpdateStatus.ADMITTED.value  # the parameter load_sql's last statement takes


def read_loaded(cursor: Any, using: str, into: Loaded) -> None:
    """Decode the six result sets of ``load_sql`` (the cursor at the first of them) into ``into``.

    Raises:
        DatabaseError: fewer result sets than statements; any other exception: a row could not be
            converted.
    """
    assert into.admitted is not None and into.signals is not None
    aware = backend(using).datetime_reader()
    runs: dict[str, RunRow] = {}
    _decode_runs(_rows(cursor), aware, runs)
    into.runs.update(runs)
    steps: dict[str, dict[int, StepRecord]] = {row.run_id: {} for row in runs.values()}
    _next_result(cursor)
    _decode_steps(_rows(cursor), aware, steps)
    into.steps.update(steps)
    applied: dict[str, list[AppliedRecord]] = {}
    _next_result(cursor)
    _decode_applied(_rows(cursor), applied)
    into.applied.update((run_id, records) for run_id, records in applied.items() if run_id in steps)
    _next_result(cursor)
    _decode_timers(_rows(cursor), aware, using, into.timers)
    _next_result(cursor)
    _decode_signals(_rows(cursor), list(runs), into.signals)
    _next_result(cursor)
    _decode_admitted(_rows(cursor), into.admitted)


def empty_loaded() -> Loaded:
    """A Loaded with nothing in it (admitted updates and signals read: PostgreSQL's batch form)."""
    return Loaded({}, {}, {}, {}, {}, {})


def merge_loaded(first: Loaded, second: Loaded) -> Loaded:
    """Both loads' rows in one (admitted updates and signals read only when both read them)."""
    admitted = None if first.admitted is None or second.admitted is None else {**first.admitted, **second.admitted}
    signals = None if first.signals is None or second.signals is None else {**first.signals, **second.signals}
    return Loaded(
        {**first.runs, **second.runs},
        {**first.steps, **second.steps},
        {**first.applied, **second.applied},
        {**first.timers, **second.timers},
        admitted,
        signals,
    )


def client_binding(using: str) -> bool:
    """Whether the backend batches statements and this connection's cursors take several statements
    in one execute (``_client_binding``): the form PostgreSQL's one-round-trip load needs."""
    if not backend(using).batches_statements:
        return False
    with connections[using].cursor() as cursor:
        return _client_binding(cursor)


def _load_batched(cursor: Any, workflow_ids: list[str], using: str) -> Loaded:
    """The PostgreSQL load: six statements in one query string per chunk of ids. Steps and applied
    updates are keyed by the runs through a subquery on the same ids. Each statement reads its own
    snapshot (READ COMMITTED), as the separate queries did; rows of a run that began after the runs
    statement are dropped (the claim's epoch fences whatever the engine does with the older run)."""
    loaded = empty_loaded()
    for chunk in _chunks(workflow_ids):
        marks = ", ".join(["%s"] * len(chunk))
        cursor.execute(load_sql(f"IN ({marks})"), [*chunk * 6, ADMITTED_PARAM])
        read_loaded(cursor, using, loaded)
    return loaded


def _next_result(cursor: Any) -> None:
    if not cursor.nextset():
        raise DatabaseError("the load batch returned fewer result sets than it has statements")


def _read_chunked(
    using: str, keys: list[Any], build_sql: Callable[[str], str], decode: Callable[[list[Any]], None]
) -> None:
    """Run ``build_sql(placeholders)`` (one of the ``_*_sql`` builders above) for each chunk of ``keys``
    (no ORM compile) and hand its rows to ``decode``."""
    if not keys:
        return
    with connections[using].cursor() as cursor:
        for chunk in _chunks(keys):
            cursor.execute(build_sql(f"IN ({', '.join(['%s'] * len(chunk))})"), chunk)
            decode(_rows(cursor))


def load_runs(workflow_ids: list[str], using: str) -> dict[str, RunRow]:
    """The current run of each of these workflows, by id.

    Args:
        workflow_ids: the workflows.
        using: the connection alias.
    """
    rows: dict[str, RunRow] = {}
    aware = backend(using).datetime_reader()
    _read_chunked(using, workflow_ids, _runs_sql, lambda values: _decode_runs(values, aware, rows))
    return rows


def load_steps(run_ids: list[str], using: str) -> dict[str, dict[int, StepRecord]]:
    """The step log of each of these runs: {run id: {seq: step}}.

    Args:
        run_ids: the runs (uuid text).
        using: the connection alias.
    """
    steps: dict[str, dict[int, StepRecord]] = {run_id: {} for run_id in run_ids}
    aware = backend(using).datetime_reader()
    _read_chunked(using, _run_keys(run_ids, using), _steps_sql, lambda values: _decode_steps(values, aware, steps))
    return steps


def load_applied(run_ids: list[str], using: str) -> dict[str, list[AppliedRecord]]:
    """The applied-update log of these runs, for replay: run id -> records in (seq, n) order.

    Args:
        run_ids: the runs (uuid text).
        using: the connection alias.
    """
    applied: dict[str, list[AppliedRecord]] = {}
    keys = _run_keys(run_ids, using)
    _read_chunked(using, keys, _applied_sql, lambda values: _decode_applied(values, applied))
    return applied


def load_timers(workflow_ids: list[str], using: str) -> dict[str, list[Timer]]:
    """The timers of these workflows (any run), by workflow id.

    Args:
        workflow_ids: the workflows.
        using: the connection alias.
    """
    timers: dict[str, list[Timer]] = {}
    aware = backend(using).datetime_reader()
    _read_chunked(using, workflow_ids, _timers_sql, lambda values: _decode_timers(values, aware, using, timers))
    return timers


def _run_keys(run_ids: list[str], using: str) -> list[Any]:
    field = Step._meta.get_field("run_id")  # every run_id column is a UUIDField: uuid or hex text
    connection = connections[using]
    return [field.get_db_prep_value(uuid.UUID(str(run_id)), connection) for run_id in run_ids]


def _json_value(value: Any) -> Any:
    """A JSONField column as the ORM returns it (Django has psycopg return jsonb as text, like SQLite)."""
    return json.loads(value) if isinstance(value, str) else value


def _chunks(items: list[Any], size: int = 500) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
