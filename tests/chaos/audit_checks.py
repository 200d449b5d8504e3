"""The post-run checks A1-A6 of the write audit (overview and what each promises: tests/chaos/audit.py),
and ``check_audit`` that runs them all over the log.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from tests.chaos.audit_log import Audit, Write, load
from tests.chaos.audit_triggers import SHORT
from weft_django.codec import decode

ACTIVE = {"pending", "running", "suspended"}
TERMINAL = {"completed", "failed", "cancelled", "terminated", "timed_out", "continued"}
STEP_SETTLED = {"completed", "failed"}
UPDATE_SETTLED = {"completed", "rejected", "failed", "expired"}


def _ts(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value))


def _fence_violations(audit: Audit, lapse: timedelta | None) -> tuple[list[str], Counter[str]]:
    """A1 over the log. ``lapse``: how old the previous holder's heartbeat may be for a takeover of a
    claim not yet expired (the engines' TTL and takeover grace: store/claims/holding.py); None: a
    takeover must follow the claim's expiry."""
    out: list[str] = []
    kinds: Counter[str] = Counter()

    def bad(w: Write, why: str) -> None:
        out.append(f"{w.describe()}: {why}")

    epochs_given: dict[int, Write] = {}
    for w in audit.writes:
        table, engine = SHORT[w.tbl], w.engine
        who = "engine" if engine else "client"
        if table == "claim":
            new_epoch = w.now("epoch")
            if new_epoch and (w.op == "INSERT" or w.changed("epoch")):
                first = epochs_given.setdefault(new_epoch, w)
                if first is not w:
                    bad(w, f"epoch {new_epoch} given again (first by #{first.id} to {first.workflow_id})")
            if w.op != "UPDATE":
                kinds[f"{who} claim {w.op.lower()}"] += 1
                continue
            old_holder, new_holder = w.was("engine_id"), w.now("engine_id")
            if engine is None:
                kinds["client claim transition"] += 1
                if new_holder is not None and new_holder != old_holder:
                    bad(w, "a client gave the claim to an engine")
                continue
            if w.changed("epoch"):
                if (new_epoch or 0) <= (w.was("epoch") or 0):
                    bad(w, "the epoch did not go up")
                if new_holder != engine:
                    bad(w, "an engine moved the epoch without taking the claim")
                elif old_holder is None:
                    kinds["engine claim acquire"] += 1
                else:
                    kinds["engine claim takeover"] += 1
                    expires = _ts(w.was("expires_at"))
                    beat = w.holder_heartbeat
                    lapsed = lapse is not None and beat is not None and beat + lapse < w.at
                    if old_holder != engine and (expires is None or expires >= w.at) and not lapsed:
                        bad(w, f"took over a live claim (it expired at {expires}, its holder's heartbeat {beat})")
            elif old_holder != engine:
                bad(w, f"changed a claim held by {old_holder!r}")
            elif new_holder is None:
                kinds["engine claim release"] += 1
            elif new_holder == engine:
                if w.changed("expires_at"):
                    expires = _ts(w.now("expires_at"))
                    dormant = lapse is not None and expires is not None and expires > w.at + 2 * lapse
                    kinds["engine claim renew, dormant" if dormant else "engine claim renew"] += 1
                else:
                    kinds["engine claim other"] += 1
            else:
                bad(w, "handed the claim to another engine")
            continue
        if engine is None:
            _client_write(w, bad, kinds)
            continue
        if table in ("step", "applied"):
            kinds[f"engine {table} {w.op.lower()}"] += 1
            if w.op == "DELETE" and w.wf_status in TERMINAL:
                continue  # retention of a finished run
            why = audit.fenced(w, epoch_column=table == "step")
            if why:
                bad(w, why)
        elif table == "workflow":
            if w.op == "INSERT":
                if w.row.get("parent_id") is not None:
                    kinds["engine child start"] += 1
                    if not (w.parent_claim_mine and w.parent_claim_engine == engine):
                        bad(w, f"a child started without its parent's claim ({w.parent_claim_engine!r})")
                elif w.row.get("schedule_id") is not None:
                    kinds["engine schedule fire"] += 1
                else:
                    bad(w, "an engine started a workflow that is nobody's child and no schedule's fire")
            elif w.op == "DELETE":
                kinds["engine workflow delete"] += 1
                if w.was("status") not in TERMINAL:
                    bad(w, "an engine deleted an active workflow")
            elif w.was("status") == "pending" and w.now("status") == "running":
                kinds["engine delayed start"] += 1
                if not w.claim_mine:
                    bad(w, "a delayed start without the claim row locked")
            else:
                kinds["engine workflow update"] += 1
                why = audit.fenced(w, epoch_column=False)
                closing_child = (
                    w.now("status") in TERMINAL
                    and w.parent_claim_mine
                    and w.parent_claim_engine == engine
                    and w.now("status") != "completed"
                )
                if why and not closing_child:
                    bad(w, why)
        elif table == "signal":
            if w.op == "INSERT":
                kinds["engine child-terminal record"] += 1  # into the parent's mailbox, under the child's fence
            elif w.op == "DELETE":
                kinds["engine signal delete"] += 1
                if w.wf_status in ACTIVE:
                    bad(w, "an engine deleted a signal of an active run")
            else:
                kinds["engine signal update"] += 1
                why = audit.fenced(w, epoch_column=False)
                if why:
                    bad(w, why)
        elif table == "update":
            if w.op == "INSERT":
                bad(w, "an engine admitted an update")
            elif w.op == "DELETE":
                kinds["engine update retention"] += 1
                if w.was("status") not in UPDATE_SETTLED:
                    bad(w, "an engine deleted an unsettled update")
            elif audit.fenced(w, epoch_column=False) is None:
                kinds["engine update settle"] += 1
            elif w.was("status") == "admitted" and w.now("status") == "expired":
                kinds["engine update cleanup (abandoned)"] += 1
            elif (
                w.was("status") in ("admitted", "accepted")
                and w.now("status") == "failed"
                and (w.wf_status not in ACTIVE or w.wf_run_id != w.row.get("run_id"))
            ):
                kinds["engine update cleanup (run ended)"] += 1
            else:
                bad(w, audit.fenced(w, epoch_column=False) or "")
    return out, kinds


def _client_write(w: Write, bad: Any, kinds: Counter[str]) -> None:
    """A client (not an engine): start, signal, update and transitions are legitimate; the rest only an
    engine may write."""
    table = SHORT[w.tbl]
    if w.op == "DELETE":
        kinds[f"client {table} delete"] += 1
        return
    if table in ("step", "applied"):
        bad(w, f"a client wrote a {table}")
    elif table == "workflow":
        if w.op == "INSERT":
            kinds["client start"] += 1
        elif w.now("status") in ("completed", "failed") and w.changed("status"):
            bad(w, "a client ended a run as completed/failed (only its engine may)")
        else:
            kinds["client workflow transition"] += 1
    elif table == "signal":
        if w.op == "INSERT":
            kinds["client signal"] += 1
        elif w.was("state") == "buffered" and w.now("state") == "dropped":
            kinds["client transition drops a signal"] += 1
        else:
            bad(w, "a client changed a signal's state")
    elif table == "update":
        if w.op == "INSERT":
            kinds["client update admitted"] += 1
        elif w.was("status") == "admitted" and w.now("status") == "expired":
            kinds["client update expired (caller's timeout)"] += 1
        elif w.was("status") == "expired" and w.now("status") == "admitted":
            kinds["client update re-admitted (retry)"] += 1
        elif w.was("status") in ("admitted", "accepted") and w.now("status") == "failed":
            kinds["client transition fails an update"] += 1
        else:
            bad(w, "a client settled an update (only its engine may)")


def duplicate_steps(audit: Audit) -> list[str]:
    out = []
    inserted: dict[str, Write] = {}
    for w in audit.writes:
        if w.tbl != "weft_django_step":
            continue
        if w.op == "INSERT":
            first = inserted.setdefault(w.key, w)
            if first is not w:
                out.append(f"{w.describe()}: step inserted again (first #{first.id})")
        elif (
            w.op == "UPDATE"
            and w.was("status") in STEP_SETTLED
            and any(w.changed(column) for column in ("status", "result", "kind", "name"))
        ):
            out.append(f"{w.describe()}: a settled step's outcome rewritten")
    return out


def runs_ended_twice(audit: Audit) -> list[str]:
    out = []
    ended: dict[tuple[str, Any], Write] = {}
    for w in audit.writes:
        if w.tbl != "weft_django_workflow" or w.op != "UPDATE":
            continue
        run = (w.key, w.now("run_id"))
        if w.was("status") in TERMINAL and w.was("run_id") == w.now("run_id"):
            if w.changed("status") or w.changed("result"):
                out.append(f"{w.describe()}: changed after its run ended (ended by #{ended.get(run, w).id})")
        elif w.now("status") in TERMINAL:
            first = ended.setdefault(run, w)
            if first is not w:
                out.append(f"{w.describe()}: the run ended again (first by #{first.id})")
    return out


def double_consumption(audit: Audit) -> list[str]:
    out = []
    consumed: dict[str, Write] = {}
    settled: dict[str, Write] = {}
    for w in audit.writes:
        if w.op != "UPDATE":
            continue
        if w.tbl == "weft_django_bufferedsignal":
            if w.was("state") in ("consumed", "dropped") and (w.changed("state") or w.changed("consumed_seq")):
                out.append(f"{w.describe()}: a {w.was('state')} signal changed again")
            elif w.now("state") == "consumed":
                first = consumed.setdefault(w.key, w)
                if first is not w:
                    out.append(f"{w.describe()}: consumed again (first by #{first.id})")
        elif w.tbl == "weft_django_pendingupdate":
            if w.was("status") in UPDATE_SETTLED and w.was("status") != "expired" and w.changed("status"):
                out.append(f"{w.describe()}: a settled update settled again")
            elif w.was("status") in UPDATE_SETTLED and w.changed("result"):
                out.append(f"{w.describe()}: a settled update's result rewritten")
            elif w.now("status") in UPDATE_SETTLED and w.now("status") != "expired":
                first = settled.setdefault(w.key, w)
                if first is not w:
                    out.append(f"{w.describe()}: settled again (first by #{first.id})")
    return out


def durable_in_order(audit: Audit, sequential_runs: set[str]) -> list[str]:
    """A step of a sequential workflow is made only after the previous step's outcome is known, so it
    must not become durable before that outcome does: for seq k, the commit that first writes step k is
    the commit that settles step k - 1 or a later one. Likewise an applied update (at seq s) and an
    update's settlement come with or after every step before s; a consumption comes with its step."""
    out = []
    first_write: dict[tuple[str, int], Write] = {}
    settled_at: dict[tuple[str, int], Write] = {}
    applied: list[Write] = []
    consumptions: list[Write] = []
    answers: list[Write] = []
    for w in audit.writes:
        row = w.row
        if w.tbl == "weft_django_step" and w.op != "DELETE":
            key = (str(row.get("run_id")), int(row["seq"]))
            first_write.setdefault(key, w)
            if row.get("status") in STEP_SETTLED and w.was("status") not in STEP_SETTLED:
                settled_at.setdefault(key, w)
        elif w.tbl == "weft_django_appliedupdate" and w.op == "INSERT":
            applied.append(w)
        elif w.tbl == "weft_django_bufferedsignal" and w.op == "UPDATE" and w.now("state") == "consumed":
            if w.was("state") != "consumed":
                consumptions.append(w)
        elif (
            w.tbl == "weft_django_pendingupdate"
            and w.op == "UPDATE"
            and w.changed("status")
            and w.now("status") in ("completed", "accepted")
        ):
            answers.append(w)

    def before_durable(run: str, seq: int, w: Write) -> str | None:
        """None if every step < seq of run had settled in w's commit or an earlier one."""
        for earlier in range(seq):
            done = settled_at.get((run, earlier))
            if done is None:
                return f"seq {earlier} never settled"
            if done.txid != w.txid and done.id > w.id:
                return f"seq {earlier} settled later, by {done.describe()}"
        return None

    for (run, seq), w in first_write.items():
        if run not in sequential_runs or seq == 0:
            continue
        previous = settled_at.get((run, seq - 1))
        if previous is None:
            out.append(f"{w.describe()}: durable while seq {seq - 1} never settled")
        elif previous.txid != w.txid and previous.id > w.id:
            out.append(f"{w.describe()}: durable before seq {seq - 1} settled (by {previous.describe()})")
    for w in applied:
        run = str(w.row.get("run_id"))
        if run in sequential_runs:
            why = before_durable(run, int(w.row["seq"]), w)
            if why:
                out.append(f"{w.describe()}: update applied at seq {w.row.get('seq')} while {why}")
    # An update's answer: its wait_for_update step (accepted) or its applied row must be durable with it.
    taken: dict[str, tuple[str, int, Write]] = {}
    for (run, seq), w in settled_at.items():
        if w.row.get("kind") == "update" and run in sequential_runs:
            try:
                record = decode(w.row.get("result") or "null")
            except Exception:  # a corrupt record is another check's business
                continue
            if isinstance(record, dict) and record.get("update_id"):
                taken[str(record["update_id"])] = (run, seq, w)
    for w in answers:
        if w.key in taken:
            run, seq, step = taken[w.key]
            if w.now("status") == "accepted" and step.txid != w.txid:
                out.append(f"{w.describe()}: accepted apart from its step {step.describe()}")
            why = before_durable(run, seq, w)
            if why:
                out.append(f"{w.describe()}: answered (taken at seq {seq}) while {why}")
    steps_by_tx = {(str(w.row.get("run_id")), int(w.row["seq"]), w.txid) for w in settled_at.values()}
    for w in consumptions:
        run, seq = str(w.row.get("run_id")), w.now("consumed_seq")
        if run in sequential_runs and (run, seq, w.txid) not in steps_by_tx:
            out.append(f"{w.describe()}: consumed apart from the commit that settled its step seq {seq}")
    return out


@dataclass(frozen=True)
class AckedMessage:
    """A message the client was told is durable: ``kind`` "signal" (signal() returned) or "update"
    (update() returned a result); ``via`` for updates: "handler" (on_update) or "wait" (wait_for_update)."""

    workflow_id: str
    kind: str
    key: str  # signal_id, or the update's idempotency key
    via: str = "handler"


def acknowledged_in_history(acked: Iterable[AckedMessage], using: str = "default") -> list[str]:
    out = []
    acked = list(acked)
    ids = sorted({a.workflow_id for a in acked})
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT id, status, run_id::text FROM weft_django_workflow WHERE id = ANY(%s)",
            [ids],
        )
        runs = {wid: (status, run) for wid, status, run in cursor.fetchall()}
        cursor.execute(
            "SELECT run_id::text, seq, kind, status, result FROM weft_django_step WHERE workflow_id = ANY(%s)",
            [ids],
        )
        steps = {(run, seq): (kind, status, result) for run, seq, kind, status, result in cursor.fetchall()}
        cursor.execute(
            "SELECT workflow_id, signal_id, run_id::text, state, consumed_seq FROM weft_django_bufferedsignal"
            " WHERE workflow_id = ANY(%s)",
            [ids],
        )
        signals: dict[tuple[str, str], list[tuple[str, str, int | None]]] = defaultdict(list)
        for wid, signal_id, run, state, seq in cursor.fetchall():
            signals[(wid, signal_id)].append((run, state, seq))
        cursor.execute(
            "SELECT u.workflow_id, u.idempotency_key, u.id::text, u.run_id::text, u.status,"
            " (SELECT count(*) FROM weft_django_appliedupdate a WHERE a.update_id = u.id AND a.run_id = u.run_id)"
            " FROM weft_django_pendingupdate u WHERE u.workflow_id = ANY(%s)",
            [ids],
        )
        updates: dict[tuple[str, str], list[tuple[str, str, str, int]]] = defaultdict(list)
        for wid, key, pk, run, status, n_applied in cursor.fetchall():
            updates[(wid, key)].append((pk, run, status, n_applied))
    taken: dict[str, tuple[str, int]] = {}
    for (run, seq), (kind, status, result) in steps.items():
        if kind == "update" and status == "completed" and result:
            try:
                record = decode(result)
            except Exception:  # as above
                continue
            if isinstance(record, dict) and record.get("update_id"):
                taken[str(record["update_id"])] = (run, seq)
    for ack in acked:
        status, final_run = runs.get(ack.workflow_id, (None, None))
        where = f"{ack.workflow_id}: {ack.kind} {ack.key!r}"
        if status is None:
            out.append(f"{where}: its workflow is gone")
            continue
        if ack.kind == "signal":
            found = signals.get((ack.workflow_id, ack.key), [])
            if len(found) != 1:
                out.append(f"{where}: stored {len(found)} times")
                continue
            run, state, seq = found[0]
            if state == "consumed":
                step = steps.get((run, seq)) if seq is not None else None
                if run != final_run or step is None or step[0] != "signal" or step[1] not in STEP_SETTLED:
                    out.append(f"{where}: consumed at seq {seq} of run {run}, not a settled signal step of {final_run}")
            elif state == "dropped":
                if status in ACTIVE:
                    out.append(f"{where}: dropped but the run is still {status}")
            elif status not in ACTIVE:
                out.append(f"{where}: still {state} on a {status} run (neither consumed nor dropped)")
        else:
            found_updates = [u for u in updates.get((ack.workflow_id, ack.key), []) if u[2] == "completed"]
            if len(found_updates) != 1:
                out.append(f"{where}: {len(found_updates)} completed rows")
                continue
            pk, run, _, n_applied = found_updates[0]
            if run != final_run:
                out.append(f"{where}: completed in run {run}, the run that finished is {final_run}")
            elif ack.via == "handler" and n_applied != 1:
                out.append(f"{where}: {n_applied} applied-update rows in the final run")
            elif ack.via == "wait":
                at = taken.get(pk)
                if at is None or at[0] != final_run:
                    out.append(f"{where}: no completed wait_for_update step of the final run took it")
    return out


def check_audit(
    acked: Iterable[AckedMessage], sequential_types: set[str], using: str = "default", lapse: timedelta | None = None
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Run every audit check: ({name: violations}, figures about the log). ``lapse``: as for A1's
    ``_fence_violations``."""
    audit = Audit(load(using))
    fence, kinds = _fence_violations(audit, lapse)
    sequential_runs = {
        str(w.row.get("run_id"))
        for w in audit.writes
        if w.tbl == "weft_django_workflow" and w.row.get("workflow_type") in sequential_types
    }
    violations = {
        "A1 fenced writes (no stale epoch, no non-holder)": fence,
        "A2 no duplicate steps": duplicate_steps(audit),
        "A3 no run ended twice": runs_ended_twice(audit),
        "A4 no double consumption or settlement": double_consumption(audit),
        "A5 durable in the order made": durable_in_order(audit, sequential_runs),
        "A6 acknowledged messages in the final history": acknowledged_in_history(acked, using),
    }
    by_table = Counter(SHORT[w.tbl] for w in audit.writes)
    figures = {
        "audited_writes": len(audit.writes),
        "by_table": dict(sorted(by_table.items())),
        "engine_writes": sum(1 for w in audit.writes if w.engine),
        "client_writes": sum(1 for w in audit.writes if not w.engine),
        "transactions": len({w.txid for w in audit.writes}),
        "by_kind": dict(sorted(kinds.items())),
    }
    return violations, figures
