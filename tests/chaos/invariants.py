"""Invariants over the tables after a chaos run: ARCHITECTURE §3's (I1-I7) plus the ones that say
nothing acknowledged was lost. Reusable: build an ``Expectations`` from what your run sent and was told,
call ``check(expectations)``, and every list in the answer must be empty.

Each check returns human-readable violations (strings naming the workflow and what was wrong), never
raises, so one run reports every broken invariant at once. docs/reliability.md explains each one.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connections

from weft_django.codec import decode
from weft_django.models import (
    AppliedUpdate,
    BufferedSignal,
    PendingUpdate,
    Step,
    Timer,
    Workflow,
    WorkflowClaim,
)
from weft_django.status import ACTIVE_STATUSES, TERMINAL_STATUSES


@dataclass(frozen=True)
class AckedSignal:
    """A signal whose ``signal()`` call returned: it is durable."""

    workflow_id: str
    name: str
    signal_id: str
    consumed_expected: bool = True  # the workflow waits for it before it can finish


@dataclass
class AckedUpdate:
    """An update whose ``update()`` call returned (a result) or raised UpdateValidationError (rejected).
    ``responses`` holds what every call with this idempotency key was told, retries included."""

    workflow_id: str
    name: str
    key: str
    outcome: str  # "completed" | "rejected"
    responses: list[Any] = field(default_factory=list)
    via: str = "handler"  # "handler" (on_update: one AppliedUpdate row) or "wait" (wait_for_update: a step)


@dataclass
class Expectations:
    results: dict[str, Any]  # workflow id -> the result it must end with (status completed)
    signals: list[AckedSignal] = field(default_factory=list)
    updates: list[AckedUpdate] = field(default_factory=list)
    dead_engines: set[str] = field(default_factory=set)  # killed (or frozen) engine ids
    grace: timedelta = timedelta(seconds=2)  # takeover grace (2 x renew interval) for the dead-claim check
    slack: timedelta = timedelta(seconds=0)  # extra allowance for the scan that takes claims over
    ttl: timedelta = timedelta(seconds=2)  # the claim TTL (a dormant claim lapses with its holder's heartbeat)


Check = Callable[[Expectations, str], list[str]]


def _steps_by_run(using: str) -> dict[str, list[Step]]:
    runs: dict[str, list[Step]] = defaultdict(list)
    for step in Step.objects.using(using).order_by("run_id", "seq"):
        runs[str(step.run_id)].append(step)
    return runs


def one_step_per_seq(exp: Expectations, using: str) -> list[str]:
    """(I1) at most one Step row per (run, seq); a finished run's log has no gaps and nothing left running."""
    out = []
    counts = Counter(Step.objects.using(using).values_list("run_id", "seq"))
    out += [f"run {run} seq {seq}: {n} step rows" for (run, seq), n in counts.items() if n > 1]
    finished = {
        str(run_id): wid
        for wid, run_id in Workflow.objects.using(using)
        .filter(status__in=list(TERMINAL_STATUSES))
        .values_list("id", "run_id")
    }
    for run_id, steps in _steps_by_run(using).items():
        if run_id not in finished:
            continue
        seqs = [s.seq for s in steps]
        if seqs != list(range(len(seqs))):
            out.append(f"{finished[run_id]}: step seqs {seqs} are not 0..{len(seqs) - 1}")
        out += [f"{finished[run_id]}: seq {s.seq} still {s.status}" for s in steps if s.status == "running"]
    return out


def results_as_expected(exp: Expectations, using: str) -> list[str]:
    """(I7 + I1) every expected run is completed with exactly the result its inputs and messages fix,
    so the result was computed from one recorded outcome per step."""
    out = []
    rows = {w.id: w for w in Workflow.objects.using(using).filter(id__in=list(exp.results))}
    for wid, expected in exp.results.items():
        row = rows.get(wid)
        if row is None:
            out.append(f"{wid}: missing")
        elif row.status != "completed":
            out.append(f"{wid}: {row.status} (error {row.error}), expected completed")
        elif decode(row.result) != expected:
            out.append(f"{wid}: result {decode(row.result)!r} != expected {expected!r}")
    return out


def no_active_workflows(exp: Expectations, using: str) -> list[str]:
    """(I7) nothing is left pending, running or suspended once the run is over."""
    return [
        f"{wid}: still {status} (current step {step!r})"
        for wid, status, step in Workflow.objects.using(using)
        .filter(status__in=list(ACTIVE_STATUSES))
        .values_list("id", "status", "current_step")
    ]


def epochs_never_go_back(exp: Expectations, using: str) -> list[str]:
    """(I2, I3) within a run, a step never carries an older epoch than one committed before it (by seq
    and by commit time), and the claim's epoch is at least every step's: no write from a deposed or
    released holder landed after a takeover."""
    out = []
    claims = dict(WorkflowClaim.objects.using(using).values_list("workflow_id", "epoch"))
    for steps in _steps_by_run(using).values():
        wid = steps[0].workflow_id
        by_seq = [s.epoch for s in steps]
        if by_seq != sorted(by_seq):
            out.append(f"{wid}: step epochs by seq go back: {by_seq}")
        done = sorted((s for s in steps if s.completed_at is not None), key=lambda s: (s.completed_at, s.seq))
        by_time = [s.epoch for s in done]
        if by_time != sorted(by_time):
            out.append(f"{wid}: step epochs by commit time go back: {by_time}")
        if wid in claims and claims[wid] < max(by_seq):
            out.append(f"{wid}: claim epoch {claims[wid]} < step epoch {max(by_seq)}")
    return out


def epochs_unique(exp: Expectations, using: str) -> list[str]:
    """(I4) epochs come from one global sequence: no two workflows hold the same (non-zero) epoch, so
    an epoch is never reused for an id across takeover, release, purge or reuse."""
    counts = Counter(WorkflowClaim.objects.using(using).exclude(epoch=0).values_list("epoch", flat=True))
    return [f"epoch {epoch} held by {n} claim rows" for epoch, n in counts.items() if n > 1]


def signals_accounted_for(exp: Expectations, using: str) -> list[str]:
    """(I5) every acknowledged signal is stored once; it is consumed at most once, by a signal step of its
    run, or dropped at the terminal commit, or still buffered on a live run."""
    out = []
    rows: dict[tuple[str, str], list[BufferedSignal]] = defaultdict(list)
    for row in BufferedSignal.objects.using(using).filter(workflow_id__in={s.workflow_id for s in exp.signals}):
        rows[(row.workflow_id, row.signal_id or "")].append(row)
    status = dict(Workflow.objects.using(using).values_list("id", "status"))
    signal_steps = set(Step.objects.using(using).filter(kind="signal").values_list("run_id", "seq"))
    for ack in exp.signals:
        found = rows.get((ack.workflow_id, ack.signal_id), [])
        if len(found) != 1:
            out.append(f"{ack.workflow_id}: signal {ack.signal_id!r} stored {len(found)} times")
            continue
        row = found[0]
        live = status.get(ack.workflow_id) in ACTIVE_STATUSES
        if row.state == "consumed":
            if (row.run_id, row.consumed_seq) not in signal_steps:
                out.append(
                    f"{ack.workflow_id}: signal {ack.signal_id!r} consumed at seq {row.consumed_seq}, no such step"
                )
        elif row.state == "buffered" and not live:
            out.append(
                f"{ack.workflow_id}: signal {ack.signal_id!r} still buffered on a {status.get(ack.workflow_id)} run"
            )
        elif ack.consumed_expected and not live:
            out.append(f"{ack.workflow_id}: signal {ack.signal_id!r} {row.state}, expected consumed")
    consumed = Counter(
        BufferedSignal.objects.using(using).filter(state="consumed").values_list("run_id", "consumed_seq")
    )
    out += [f"run {run} seq {seq}: {n} signals consumed by one step" for (run, seq), n in consumed.items() if n > 1]
    return out


def updates_accounted_for(exp: Expectations, using: str) -> list[str]:
    """(I6) every acknowledged update has one request row in the outcome the caller was told, every
    call with its key was told the same thing, and a completed one was applied exactly once
    (one AppliedUpdate row; a rejected one none)."""
    out = []
    rows = {
        (r.workflow_id, r.idempotency_key): r
        for r in PendingUpdate.objects.using(using).filter(workflow_id__in={u.workflow_id for u in exp.updates})
    }
    applied = Counter(AppliedUpdate.objects.using(using).values_list("update_id", flat=True))
    for ack in exp.updates:
        row = rows.get((ack.workflow_id, ack.key))
        if row is None:
            out.append(f"{ack.workflow_id}: update {ack.key!r} acknowledged but not stored")
            continue
        if row.status != ack.outcome:
            out.append(f"{ack.workflow_id}: update {ack.key!r} is {row.status}, the caller was told {ack.outcome}")
        if len({repr(r) for r in ack.responses}) > 1:
            out.append(f"{ack.workflow_id}: update {ack.key!r} answered differently on retry: {ack.responses}")
        expected_applied = 1 if ack.outcome == "completed" and ack.via == "handler" else 0
        if applied.get(row.id, 0) != expected_applied:
            out.append(f"{ack.workflow_id}: update {ack.key!r} applied {applied.get(row.id, 0)} times")
        if ack.outcome == "completed" and ack.responses and decode(row.result) != ack.responses[0]:
            out.append(
                f"{ack.workflow_id}: update {ack.key!r} stored {decode(row.result)!r}, told {ack.responses[0]!r}"
            )
    dup = Counter(AppliedUpdate.objects.using(using).values_list("run_id", "seq", "n"))
    out += [f"run {run} seq {seq} n {n}: {k} applied-update rows" for (run, seq, n), k in dup.items() if k > 1]
    terminal = set(
        Workflow.objects.using(using).filter(status__in=list(TERMINAL_STATUSES)).values_list("id", flat=True)
    )
    out += [
        f"{wid}: update {key!r} still admitted on a terminal run"
        for wid, key in PendingUpdate.objects.using(using)
        .filter(status="admitted", workflow_id__in=terminal)
        .values_list("workflow_id", "idempotency_key")
    ]
    return out


def no_orphaned_timers(exp: Expectations, using: str) -> list[str]:
    """No timer outlives its run: every timer belongs to a live workflow's current run."""
    current = {
        wid: (status, str(run_id))
        for wid, status, run_id in Workflow.objects.using(using).values_list("id", "status", "run_id")
    }
    out = []
    for timer in Timer.objects.using(using).all():
        status, run_id = current.get(timer.workflow_id, (None, None))
        if status is None:
            out.append(f"timer {timer}: its workflow is missing")
        elif status in TERMINAL_STATUSES:
            out.append(f"timer {timer}: its workflow is {status}")
        elif timer.run_id is not None and str(timer.run_id) != run_id:
            out.append(f"timer {timer}: belongs to an older run")
    return out


def stale_claims(exp: Expectations, using: str) -> list[str]:
    """No claim is held by a dead engine once TTL + grace (+ slack for the takeover scan) has passed
    since its last renewal, or (a dormant claim, ADR 0014) since its last heartbeat; and a finished
    workflow's claim is released."""
    out = []
    allowance_ms = round((exp.grace + exp.slack).total_seconds() * 1000)
    lapse_ms = allowance_ms + round(exp.ttl.total_seconds() * 1000)
    if exp.dead_engines:
        with connections[using].cursor() as cursor:
            cursor.execute(
                """SELECT c.workflow_id, c.engine_id, c.expires_at FROM weft_django_workflowclaim c
                   JOIN weft_django_workflow w ON w.id = c.workflow_id
                   LEFT JOIN weft_django_engine e ON e.id = c.engine_id
                   WHERE w.status = 'running' AND c.engine_id = ANY(%s)
                     AND (c.expires_at + %s * interval '1 millisecond' < clock_timestamp()
                          OR e.heartbeat_at + %s * interval '1 millisecond' < clock_timestamp())""",
                [sorted(exp.dead_engines), allowance_ms, lapse_ms],
            )
            out += [
                f"{wid}: still held by dead engine {engine} (expired {at})" for wid, engine, at in cursor.fetchall()
            ]
    status = dict(Workflow.objects.using(using).values_list("id", "status"))
    out += [
        f"{wid}: {status.get(wid)} but its claim is still held by {engine}"
        for wid, engine in WorkflowClaim.objects.using(using)
        .filter(engine_id__isnull=False)
        .values_list("workflow_id", "engine_id")
        if status.get(wid) in TERMINAL_STATUSES
    ]
    return out


CHECKS: dict[str, Check] = {
    "I1 one step per (run, seq)": one_step_per_seq,
    "I2/I3 no write from an older epoch": epochs_never_go_back,
    "I4 epochs never reused": epochs_unique,
    "I5 signals accounted for": signals_accounted_for,
    "I6 updates accounted for": updates_accounted_for,
    "I7 every run terminal": no_active_workflows,
    "I7 results as expected": results_as_expected,
    "timers not orphaned": no_orphaned_timers,
    "no claim held by a dead engine": stale_claims,
}


def check(exp: Expectations, using: str = "default") -> dict[str, list[str]]:
    """Run every invariant; {name: violations}. All lists empty means the run kept every promise."""
    return {name: fn(exp, using) for name, fn in CHECKS.items()}
