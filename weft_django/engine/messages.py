"""Queries and updates addressed to workflows this engine owns (ARCHITECTURE §6). Runs on the loop
thread, between turns, from Engine._tick.

Queries. A caller inserts a QueryRequest naming the engine its claim names and sends
``q:<engine id>``. The engine takes its pending requests (SKIP LOCKED on PostgreSQL), re-validates
each against the durable claim (a live context answers only while this engine holds the workflow at
that context's epoch: weft 0.21), answers ``activity_progress`` first, then the query handler, then
the exposed accessor, and writes the answer with ``a:<request id>``. Queries change no workflow
state, so the answer needs no fence. A request for a workflow that another engine holds now fails
with reason ``not_owned`` (WorkflowNotLocallyOwnedError); one for a workflow nobody holds with
``not_held``: the caller re-routes and retries within its timeout.

Updates: exactly once against the caller's timeout. The caller's timeout writes ``status = 'expired'
WHERE status = 'admitted'``. The owner settles admitted updates in a fenced transaction of their own
(store.commit.fenced_messages, through store.commit.fenced; one per workflow whose update runs a
handler or validator, so one that does not return holds only its own claim): it locks its claims, then takes the
admitted rows ``FOR UPDATE SKIP LOCKED`` (on SQLite the IMMEDIATE transaction holds the write lock),
and only then runs validators and handlers and writes each outcome (conditioned on the row still
being admitted) plus the AppliedUpdate row, in the same transaction. A claim or update row another
transaction holds is skipped and its workflow looked at again on the next pass. A row the caller
expired first is not seen; a caller that times out meanwhile waits on the row lock and then finds the
outcome. So a handler runs only where its outcome commits, and if the transaction fails anyway (a
lost connection, or the belt-and-braces admitted check fails) the workflow is dropped and replayed
from the durable log, which does not contain the update: in-memory state never keeps an update that did
not commit.

An admitted update is settled when its name has an ``on_update`` handler registered on the live
context or a ``wait_for_update`` of that name is at the frontier. Otherwise it stays admitted (a
later handler registration or wait may take it: it is looked at again whenever the frontier moves)
until its caller's timeout expires it; if the caller died, the message cleanup expires it once its
deadline is past. A ``wait_for_update`` takes the payload (status ``accepted``, its Step recording
the payload and the update id in the same transaction); ``respond()`` completes it in the next
fenced commit.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction

from ..codec import decode, encode, encode_payload, storable_text
from ..context import WorkflowContext
from ..exceptions import QueryNotFoundError, WeftError
from ..operations import WaitForUpdate
from ..status import QueryStatus, UpdateStatus
from ..store import claims, continuation, mailbox
from ..store.backend import backend
from ..store.commit import UpdateDone, UpdateRaceLost, WorkflowWrites, fenced_messages
from ..store.histories import AdmittedRow
from ..store.notify import send_many
from ..store.sessions import allow_user_code, relax_commit
from .driver import StepRecord, describe_exception
from .frontier import Leaf
from .host import EngineHost
from .owned import Owned, delivery_span

logger = logging.getLogger(__name__)
QUERY_BATCH = 200
ABANDONED_GRACE = timedelta(seconds=10)  # past a caller's deadline before the cleanup expires its request


@dataclasses.dataclass
class _MailboxState:
    """Per engine: which live contexts had their mailbox looked at, and where admitted updates wait
    that nothing handled at the frontier they were seen at (looked at again when it moves)."""

    # Weak: a context dropped, ended or evicted leaves by itself (no walk over them to forget it).
    checked: weakref.WeakValueDictionary[str, Owned] = dataclasses.field(default_factory=weakref.WeakValueDictionary)
    parked: dict[str, int] = dataclasses.field(default_factory=dict)
    # The admitted updates read with a context's load (PostgreSQL), used instead of a query by the
    # first look at that context unless a wake-up (or a sweep) names it first; consumed by any look.
    prefetched: dict[str, tuple[Owned, list[AdmittedRow]]] = dataclasses.field(default_factory=dict)
    last_sweep: float = 0.0  # time.monotonic() of the last sweep (mailbox_sweep_due)


_states: weakref.WeakKeyDictionary[EngineHost, _MailboxState] = weakref.WeakKeyDictionary()


def _state(engine: EngineHost) -> _MailboxState:
    state = _states.get(engine)
    if state is None:
        state = _states[engine] = _MailboxState()
    return state


def mailbox_sweep_due(engine: EngineHost) -> bool:
    """Whether this maintenance pass reads the signals and updates of EVERY owned workflow. Without
    LISTEN (SQLite) that is how they are found: every POLL_INTERVAL. With LISTEN every signal and
    update comes with a wake-up naming its workflow, and a lost listener connection triggers a full
    rescan, so the sweep is only a safety net: once per renew interval, not per POLL_INTERVAL (with
    10,000 parked workflows the per-poll sweep was most of an idle engine's CPU)."""
    state, clock = _state(engine), time.monotonic()
    if backend(engine.using).listens:
        every = max(engine.settings.poll_interval, engine.settings.workflow_claim_renew_interval).total_seconds()
        if clock - state.last_sweep < every:
            return False
    state.last_sweep = clock
    return True


def unchecked_mailboxes(engine: EngineHost) -> set[str]:
    """The held workflows whose live context's admitted updates no look has seen: new contexts, and
    those a look put back (``_look_again``). Read from the engine's attention index, not by walking
    every held workflow (engine/attention.py)."""
    checked, owned = _state(engine).checked, engine.owned
    return {wid for wid in engine.attention.unchecked if wid in owned and checked.get(wid) is not owned[wid]}


def _look_again(engine: EngineHost, wid: str) -> None:
    """Have the next pass look at this workflow's admitted updates again."""
    _state(engine).checked.pop(wid, None)
    engine.attention.unchecked.add(wid)


def prefetch_admitted(engine: EngineHost, owned: Owned, rows: list[AdmittedRow]) -> None:
    """Record the admitted updates read when ``owned`` was loaded (engine._load, in the same round
    trip as its run). An update admitted after that read sends a ``w:<id>`` wake-up, and a woken
    workflow is read again, so the first look at a new context may use these rows instead of a query."""
    _state(engine).prefetched[owned.workflow_id] = (owned, rows)


def deliver_messages(
    engine: EngineHost,
    workflow_ids: set[str],
    queries_waiting: bool,
    now: datetime,
    writes: dict[str, WorkflowWrites],
    changed: set[str],
) -> bool:
    """Answer pending query requests addressed to this engine and settle admitted updates of the
    owned ``workflow_ids`` (plus workflows loaded since the last look, and those whose frontier moved
    past updates nothing handled). Returns whether anything was done."""
    busy = False
    if queries_waiting:
        busy |= answer_queries(engine, now, writes)
    state = _state(engine)
    ids = {wid for wid in workflow_ids if wid in engine.owned}
    ids.update(unchecked_mailboxes(engine))
    engine.attention.unchecked.clear()  # each is looked at below (deliver_updates marks it checked)
    for wid, seq in list(state.parked.items()):
        owned = engine.owned.get(wid)
        if owned is None:
            del state.parked[wid]
        elif owned.run.frontier is not None and owned.run.frontier.seq != seq:
            ids.add(wid)
    # A workflow looked at only because it is new here (no wake-up, rescan or sweep named it this
    # pass) takes the admitted updates read with its load, if nothing read them since.
    known: dict[str, list[AdmittedRow]] = {}
    for wid, (owned, rows) in list(state.prefetched.items()):
        if engine.owned.get(wid) is not owned:
            del state.prefetched[wid]
        elif wid in ids and wid not in workflow_ids:
            known[wid] = rows
    if ids:
        busy |= deliver_updates(engine, ids, now, writes, changed, known)
    return busy


# -- updates ----------------------------------------------------------------------------------


def _waiting_leaf(owned: Owned, name: str) -> Leaf | None:
    return next(
        (leaf for leaf in owned.run.pending_leaves() if isinstance(leaf.op, WaitForUpdate) and leaf.op.name == name),
        None,
    )


def _handles(owned: Owned, name: str) -> bool:
    return name in owned.run.ctx.update_handlers or _waiting_leaf(owned, name) is not None


def _open(owned: Owned, writes: dict[str, WorkflowWrites]) -> bool:
    """Whether the live context can take updates now (not ending, not stuck, parked at a yield)."""
    run = owned.run
    if run.finished or run.frontier is None or run.ctx.detached:
        return False
    pending = writes.get(owned.workflow_id)
    return pending is None or (pending.finish is None and pending.stuck is None)


def _settleable(engine: EngineHost, owned: Owned, writes: dict[str, WorkflowWrites]) -> bool:
    """Whether an update may be settled on this context now: it is open, and everything its state
    rests on is durable (an update's outcome must never be committed ahead of a step before it)."""
    return (
        engine.owned.get(owned.workflow_id) is owned
        and _open(owned, writes)
        and engine.durable(owned.workflow_id, writes)
    )


def deliver_updates(
    engine: EngineHost,
    workflow_ids: set[str],
    now: datetime,
    writes: dict[str, WorkflowWrites],
    changed: set[str],
    known: Mapping[str, list[AdmittedRow]] | None = None,
) -> bool:
    """Settle the admitted updates of these owned workflows. ``known``: admitted updates already read
    for some of them (prefetch_admitted), in (created_at, id) order; the others are queried."""
    using = engine.using
    state = _state(engine)
    known = known or {}
    live: dict[str, Owned] = {}
    for wid in workflow_ids:
        owned = engine.owned.get(wid)
        if owned is None:
            continue
        state.checked[wid] = owned
        state.parked.pop(wid, None)
        state.prefetched.pop(wid, None)  # read once: a later look queries
        if _open(owned, writes):
            live[wid] = owned
    if not live:
        return False
    ready: dict[str, list[str]] = {}
    admitted: list[tuple[Any, str, Any, str]] = [row for wid in live if wid in known for row in known[wid]]
    unknown = [wid for wid in live if wid not in known]
    if unknown:
        admitted += mailbox.admitted_updates(unknown, using)
    coded: set[str] = set()  # the workflows with an update that runs user code (its validator, its handler)
    for pk, wid, run_id, name in admitted:
        owned = live[wid]
        if str(run_id) != owned.run_id:
            continue
        if _handles(owned, name):
            ready.setdefault(wid, []).append(str(pk))
            if name in owned.run.ctx.update_handlers:
                coded.add(wid)
        elif owned.run.frontier is not None:
            state.parked[wid] = owned.run.frontier.seq
    if not ready:
        return False
    # What these workflows recorded earlier in this pass (an activity's result, a memo) commits first:
    # the update's step and answer must not become durable ahead of it.
    engine.flush(set(ready), now, writes)
    for wid in list(ready):
        if not _settleable(engine, live[wid], writes):
            del ready[wid]
            _look_again(engine, wid)  # on the next pass, once it is durable
    if not ready:
        return False

    touched: set[str] = set()  # workflows whose in-memory state this transaction changed
    handled: set[str] = set()  # ... by an on_update handler (wait_until is re-checked after commit)

    def deliver(pk: Any, wid: str, name: str, payload: str, batch: dict[str, WorkflowWrites]) -> None:
        owned = live[wid]
        run = owned.run
        if not _settleable(engine, owned, writes):  # an earlier update of this batch answered (respond()):
            _look_again(engine, wid)  # this one is settled on a later pass, once that answer is durable
            return
        assert run.frontier is not None
        w = batch.get(wid)
        if w is None:
            w = batch[wid] = WorkflowWrites(wid, owned.run_id, owned.epoch)
        if name in run.ctx.update_handlers:
            done, ran = run_update(run.ctx, run.ctx.update_handlers[name], str(pk), name, payload)
            w.updates_done.append(done)
            touched.add(wid)
            if ran:
                handled.add(wid)
                w.applied.append(run.record_applied(name, payload, done.result, done.error, str(pk)))
            _log_outcome(wid, name, done)
            return
        leaf = _waiting_leaf(owned, name)
        if leaf is None:  # the frontier moved on in this batch: look again when it moves next
            state.parked[wid] = run.frontier.seq
            return
        try:
            text = encode({"update_id": str(pk), "payload": decode(payload)}, path=f'update "{name}" payload')
        except Exception as exc:  # a corrupt payload row: fail it rather than wedge the workflow
            w.updates_done.append(UpdateDone(str(pk), UpdateStatus.FAILED, error=_failure(exc, "payload")))
            return
        step = StepRecord(leaf.seq, "update", name, "completed", text, completed_at=now)
        w.updates_done.append(UpdateDone(str(pk), UpdateStatus.ACCEPTED))
        w.steps.append(step)
        touched.add(wid)
        run.record(step)
        owned.armed.discard(leaf.seq)
        run.settle(leaf.seq, step.outcome)
        changed.add(wid)

    def build(held: set[str]) -> list[WorkflowWrites]:
        ids = [pk for wid in sorted(held) for pk in ready.get(wid, [])]
        if not ids:
            return []
        batch: dict[str, WorkflowWrites] = {}
        taken: set[str] = set()
        for pk, wid, name, payload, sent in mailbox.lock_admitted(ids, using):
            taken.add(str(pk))
            attributes = {"weft.update": name, "weft.update_id": str(pk)}
            with delivery_span("weft.update.deliver", live[wid], sent, attributes):
                deliver(pk, wid, name, payload, batch)
        for wid in held:
            if any(pk not in taken for pk in ready.get(wid, [])):
                # Its row was skipped (another transaction holds it, SKIP LOCKED) or is no longer
                # admitted: look again next pass, not only at the next wake-up or mailbox sweep.
                _look_again(engine, wid)
        for wid, w in batch.items():
            # What the code recorded after a wait_for_update returned (a respond(), a memo) commits with
            # it: a later step must never be durable while an earlier respond() is not (replay would
            # skip that respond() as already made).
            run = live[wid].run
            w.steps.extend(run.new_steps)
            w.update_responses.extend(run.responses)
            run.new_steps, run.responses = [], []
            w.attributes.extend(run.ctx.pending_attributes)  # set by an update handler (issue 19)
            run.ctx.pending_attributes = []
        return list(batch.values())

    epochs = {wid: live[wid].epoch for wid in ready}
    # A handler or validator that does not return holds its transaction's claim locks (engine/stall.py): each
    # workflow whose update runs one settles in a transaction of its own, so that only its own claim stays
    # locked and peers can take the others over; the updates waited for (wait_for_update) share one.
    groups = [{wid} for wid in sorted(coded & set(ready))] + [set(ready) - coded]
    lost: set[str] = set()
    for group in filter(None, groups):
        try:
            result = fenced_messages(engine.engine_id, {wid: epochs[wid] for wid in group}, build, now, using)
        except DatabaseError:
            raise  # the tick reloads every workflow of this engine
        except Exception as exc:  # UpdateRaceLost, or a bug: nothing committed, so replay from the durable log
            if not isinstance(exc, UpdateRaceLost):
                logger.exception("update settlement failed engine=%s; reloading", engine.engine_id)
            else:
                logger.warning("update settlement rolled back engine=%s (%s); reloading", engine.engine_id, exc)
            for wid in touched & group:
                engine._reload[wid] = live[wid].epoch
                engine._drop(wid, reason=None)
            continue
        lost.update(result.lost)
        for wid in result.busy:  # its claim row was locked by another transaction: nothing was settled
            _look_again(engine, wid)
    if lost:
        with engine._lock:
            engine._lost.update({wid: epochs[wid] for wid in lost})
        engine._wake.set()
    for wid in handled:
        owned = engine.owned.get(wid)
        if owned is not None:
            engine._recheck_wait_until(owned, now, writes, changed)
    return bool(touched)


def run_update(
    ctx: WorkflowContext, entry: tuple[Any, Any], update_id: str, name: str, payload_text: str
) -> tuple[UpdateDone, bool]:
    """Validate and apply one update on the live context ``ctx`` (its validator read-only). Returns its
    outcome and whether the handler ran (then its effects are in memory and the update goes to the
    applied log, even if it raised)."""
    handler, validator = entry
    try:
        payload = decode(payload_text)
    except Exception as exc:
        return UpdateDone(update_id, UpdateStatus.FAILED, error=_failure(exc, "payload")), False
    try:
        with ctx.reading("an update validator"):
            issues = validation_issues(validator, payload)
    except Exception as exc:
        return UpdateDone(update_id, UpdateStatus.FAILED, error=_failure(exc, "validator")), False
    if issues:
        return UpdateDone(update_id, UpdateStatus.REJECTED, issues=issues), False
    try:
        value = handler(payload)
    except Exception as exc:
        return UpdateDone(update_id, UpdateStatus.FAILED, error=_failure(exc, "handler")), True
    try:
        text = encode_payload(value, path=f'the result of update "{name}"')
    except WeftError as exc:
        return UpdateDone(update_id, UpdateStatus.FAILED, error=_failure(exc, "result")), True
    return UpdateDone(update_id, UpdateStatus.COMPLETED, result=text), True


def _failure(exc: BaseException, stage: str) -> dict[str, Any]:
    return {**describe_exception(exc), "stage": stage}


def _log_outcome(workflow_id: str, name: str, done: UpdateDone) -> None:
    logger.info("update settled workflow=%s update=%s id=%s status=%s", workflow_id, name, done.update_id, done.status)


# -- validators --------------------------------------------------------------------------------


def validation_issues(validator: Any, payload: Any) -> list[dict[str, Any]]:
    """Run an update validator; return its issues (``[]`` accepts).

    A Django Form class validates a dict payload as its data; a pydantic model class (an optional
    dependency) validates the payload with ``model_validate``; any other callable returns None, ""
    or [] to accept, or a message, a list of messages or of {"message", "path"} dicts to reject, or
    raises django's ValidationError. Anything else it raises is a failure, not a rejection."""
    if validator is None:
        return []
    if isinstance(validator, type):
        from django import forms

        if issubclass(validator, forms.BaseForm):
            return _form_issues(validator, payload)
        if hasattr(validator, "model_validate") and hasattr(validator, "model_fields"):
            return _pydantic_issues(validator, payload)
    from django.core.exceptions import ValidationError

    try:
        verdict = validator(payload)
    except ValidationError as exc:
        return _django_issues(exc)
    return _normalise(verdict)


def _issue(message: Any, path: Any = None) -> dict[str, Any]:
    if path is not None:
        parts = [path] if isinstance(path, str | int) else list(path)
        path = [_path_part(p) for p in parts] or None
    return {"message": storable_text(str(message)), "path": path}


def _path_part(part: Any) -> str | int:
    """One element of an issue's path: an int as it is, anything else as storable text."""
    if isinstance(part, int) and not isinstance(part, bool):
        return part
    return storable_text(part if isinstance(part, str) else str(part))


def _normalise(verdict: Any) -> list[dict[str, Any]]:
    if verdict is None or verdict == "" or (isinstance(verdict, list | tuple) and not verdict):
        return []
    if isinstance(verdict, str):
        return [_issue(verdict)]
    if isinstance(verdict, Mapping) and "message" in verdict:
        return [_issue(verdict["message"], verdict.get("path"))]
    if isinstance(verdict, list | tuple):
        issues = []
        for item in verdict:
            if isinstance(item, str):
                issues.append(_issue(item))
            elif isinstance(item, Mapping) and "message" in item:
                issues.append(_issue(item["message"], item.get("path")))
            else:
                raise TypeError(_VERDICT_HELP + f" (got an item {item!r})")
        return issues
    raise TypeError(_VERDICT_HELP + f" (got {verdict!r})")


_VERDICT_HELP = (
    'An update validator returns None, "" or [] to accept, or a message, a list of messages or a list of '
    '{"message", "path"} dicts to reject'
)


def _django_issues(exc: Any) -> list[dict[str, Any]]:
    from django.core.exceptions import NON_FIELD_ERRORS

    if hasattr(exc, "error_dict"):
        return [
            _issue(message, None if field == NON_FIELD_ERRORS else [field])
            for field, errors in exc.error_dict.items()
            for error in errors
            for message in error.messages
        ]
    return [_issue(message) for message in exc.messages]


def _form_issues(form_class: Any, payload: Any) -> list[dict[str, Any]]:
    from django.core.exceptions import NON_FIELD_ERRORS

    if not isinstance(payload, Mapping):
        return [_issue(f"{form_class.__name__} expects a dict of form fields, not {type(payload).__name__}")]
    form = form_class(data=payload)
    if form.is_valid():
        return []
    return [
        _issue(message, None if field == NON_FIELD_ERRORS else [field])
        for field, errors in form.errors.as_data().items()
        for error in errors
        for message in error.messages
    ]


def _pydantic_issues(model: Any, payload: Any) -> list[dict[str, Any]]:
    from pydantic import ValidationError

    try:
        model.model_validate(payload)
    except ValidationError as exc:
        return [_issue(error["msg"], list(error["loc"]) or None) for error in exc.errors()]
    return []


# -- queries ----------------------------------------------------------------------------------

NOT_OWNED = (
    "Workflow {wid!r} is not driven by engine {me!r}: another engine currently owns it. Retry the query "
    "against the engine that currently holds the claim."
)


def answer_queries(engine: EngineHost, now: datetime, writes: dict[str, WorkflowWrites]) -> bool:
    """Answer the pending query requests addressed to this engine. Returns whether any were taken.

    A live context answers only from durable state: what its workflow recorded earlier in this pass
    is committed first (``engine.flush``); a request whose workflow's commit was deferred waits."""
    using = engine.using
    # Cheap, and takes no write lock (SQLite) when nothing waits; in the order the requests are taken.
    asked = mailbox.queries_waiting(engine.engine_id, QUERY_BATCH, using)
    if not asked:
        return False
    engine.residency.recall(engine, asked)  # an evicted workflow asked about is loaded again, then answered
    # Every owned workflow asked about: also one whose settlement was committed elsewhere (an atomic
    # activity, a Celery worker) but whose generator recorded a memo or a race's winner since.
    engine.flush({wid for wid in asked if wid in engine.owned}, now, writes)
    answered: list[str] = []
    with transaction.atomic(using=using):
        relax_commit(using)  # it carries no workflow state (a no-op where there is no WAL to wait for)
        allow_user_code(using)  # query handlers are workflow code
        taken = mailbox.take_queries(engine.engine_id, QUERY_BATCH, using)
        held = claims.holders({row[1] for row in taken}, using)
        stale: dict[str, int] = {}
        for pk, wid, name, arg, has_arg in taken:
            owned = engine.owned.get(wid)
            epoch, holder = held.get(wid, (None, None))
            if owned is not None and (epoch, holder) == (owned.epoch, engine.engine_id):
                if not engine.durable(wid, writes):
                    engine._queries_waiting = True  # its commit was deferred: answered on a later pass
                    continue
                fields = _answer(engine, wid, name, arg, has_arg)
            elif holder == engine.engine_id and owned is None:
                # Claimed by us and about to be loaded (this pass's claim step loads what is recalled):
                # answered on the next pass, not left for the next poll.
                engine._queries_waiting = engine._queries_waiting or wid in engine._reload
                continue
            elif holder is not None:
                if owned is not None:
                    stale[wid] = owned.epoch  # our live context is stale: it must not answer
                message = NOT_OWNED.format(wid=wid, me=engine.engine_id)
                fields = _failed("not_owned", "WorkflowNotLocallyOwnedError", message, holder=holder)
            else:
                message = f"Workflow {wid!r} is not held by any engine now."
                fields = _failed("not_held", "WorkflowNotLocallyOwnedError", message)
            mailbox.answer_query(pk, fields, using)
            answered.append(str(pk))
        if answered:
            send_many("a", answered, using)
    if stale:
        with engine._lock:
            engine._lost.update(stale)
        engine._wake.set()
    return bool(answered)


def _failed(reason: str, kind: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"status": QueryStatus.FAILED, "error": {"reason": reason, "type": kind, "message": message, **extra}}


def _answer(engine: EngineHost, wid: str, name: str, arg: str | None, has_arg: bool) -> dict[str, Any]:
    try:
        args = (decode(arg),) if has_arg else ()
        value = engine.answer_query(wid, name, *args)
        text = encode_payload(value, path=f'the result of query "{name}"')
    except QueryNotFoundError as exc:
        return _failed("not_found", "QueryNotFoundError", str(exc))
    except Exception as exc:
        return {"status": QueryStatus.FAILED, "error": {"reason": "handler", **describe_exception(exc)}}
    return {"status": QueryStatus.ANSWERED, "result": text}


# -- loading and cleanup ------------------------------------------------------------------------


def cleanup_interval(engine: EngineHost) -> float:
    return max(1.0, min(60.0, engine.settings.update_response_retention.total_seconds() / 4))


def cleanup_messages(engine: EngineHost, now: datetime) -> bool:
    """Engine-scoped chore: expire admitted updates whose caller stopped waiting (and died), fail the
    open updates of runs that ended without closing them, drop the signals that arrived as their run
    ended (drop_late_signals), and delete settled update responses and query requests older than
    UPDATE_RESPONSE_RETENTION. Bounded per pass."""
    started = time.monotonic()
    cutoff = now - engine.settings.update_response_retention
    # Carried over first: a signal or update that committed for a run after it continued as new.
    done = continuation.carry_late(engine.using)
    done += mailbox.cleanup(now, cutoff, ABANDONED_GRACE, engine.using)
    if done:
        logger.info("message cleanup engine=%s rows=%s took=%.3fs", engine.engine_id, done, time.monotonic() - started)
    return bool(done)
