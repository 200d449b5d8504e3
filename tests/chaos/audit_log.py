"""The log read back (overview: tests/chaos/audit.py): one ``Write`` per audited row change, ``load`` to
read ``weft_audit.writes`` in order, and ``Audit``, the log indexed for the checks (the claim as the writing
transaction held it, and whether a write was fenced).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections

from tests.chaos.audit_triggers import ENGINE_PREFIX, SCHEMA, SHORT


@dataclass
class Write:
    id: int
    tbl: str
    op: str
    key: str
    workflow_id: str | None
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    writer: str
    pid: int
    txid: int
    at: datetime
    claim_epoch: int | None
    claim_engine: str | None
    claim_mine: bool | None
    parent_claim_epoch: int | None
    parent_claim_engine: str | None
    parent_claim_mine: bool | None
    wf_status: str | None
    wf_run_id: str | None
    holder_heartbeat: datetime | None = None  # a claim write: its previous holder's last heartbeat

    @property
    def engine(self) -> str | None:
        """The writing engine's id, or None for a client."""
        return self.writer[len(ENGINE_PREFIX) :] if self.writer.startswith(ENGINE_PREFIX) else None

    @property
    def row(self) -> dict[str, Any]:
        return self.new if self.new is not None else (self.old or {})

    def was(self, column: str) -> Any:
        return (self.old or {}).get(column)

    def now(self, column: str) -> Any:
        return (self.new or {}).get(column)

    def changed(self, column: str) -> bool:
        return self.was(column) != self.now(column)

    def describe(self) -> str:
        columns = ("status", "state", "epoch", "engine_id", "seq", "kind", "consumed_seq", "run_id")
        old = {k: self.was(k) for k in columns if self.old and k in self.old}
        new = {k: self.now(k) for k in columns if self.new and k in self.new}
        return (
            f"#{self.id} {SHORT.get(self.tbl, self.tbl)} {self.op} {self.key} (workflow {self.workflow_id}) "
            f"by {self.writer or 'client'} "
            f"tx {self.txid} at {self.at.isoformat()} old={old} new={new} "
            f"claim=(epoch {self.claim_epoch}, {self.claim_engine}, locked by writer: {self.claim_mine})"
        )


def load(using: str = "default") -> list[Write]:
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"""SELECT id, tbl, op, row_key, workflow_id, old, new, writer, backend_pid, txid, at, claim_epoch,
                       claim_engine, claim_mine, parent_claim_epoch, parent_claim_engine, parent_claim_mine,
                       wf_status, wf_run_id, holder_heartbeat
                FROM {SCHEMA}.writes ORDER BY id"""
        )
        rows = cursor.fetchall()
    out = []
    for row in rows:
        values = list(row)
        for i in (5, 6):  # jsonb columns: psycopg decodes them; a str if a loader did not
            if isinstance(values[i], str):
                values[i] = json.loads(values[i])
        out.append(Write(*values))
    return out


@dataclass
class Audit:
    """The log, indexed for the checks."""

    writes: list[Write]
    claim_writes: dict[tuple[int, str], list[Write]] = field(default_factory=dict)  # (txid, workflow) -> claim writes

    def __post_init__(self) -> None:
        index: dict[tuple[int, str], list[Write]] = defaultdict(list)
        for w in self.writes:
            if w.tbl == "weft_django_workflowclaim" and w.workflow_id is not None:
                index[(w.txid, w.workflow_id)].append(w)
        self.claim_writes = dict(index)

    def claim_state(self, w: Write) -> tuple[int | None, str | None]:
        """(epoch, holder) of w's workflow's claim as the writing transaction held it."""
        own = self.claim_writes.get((w.txid, w.workflow_id or ""))
        if w.claim_mine and own:
            first = own[0]
            acquired = first.old is None or (
                first.now("engine_id") is not None and first.now("epoch") != first.was("epoch")
            )
            state = first.new if acquired else first.old
            assert state is not None
            return state.get("epoch"), state.get("engine_id")
        return w.claim_epoch, w.claim_engine

    def fenced(self, w: Write, *, epoch_column: bool) -> str | None:
        """None if w was written by the claim's holder at its current epoch under the claim's lock; else why not."""
        epoch, holder = self.claim_state(w)
        if not w.claim_mine:
            return "the writing transaction did not hold the claim row"
        if holder != w.engine:
            return f"the claim's holder was {holder!r} (epoch {epoch})"
        if epoch_column and w.row.get("epoch") != epoch:
            return f"written at epoch {w.row.get('epoch')} while the claim's epoch was {epoch}"
        return None
