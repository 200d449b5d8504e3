"""A workflow the engine holds (``Owned``: its live generator and what it waits for), and the small
helpers every part uses on one: its writes for the next fenced commit, marking it stuck, collecting
what its generator recorded by itself, the mailbox name a waiting leaf consumes."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

from .. import tracing
from ..codec import decode
from ..exceptions import WeftError
from ..models import Timer
from ..operations import StartChild
from ..store.children import mailbox_name
from ..store.commit import WorkflowWrites
from ..store.notify import BufferedRow
from . import steps
from .activities import AttemptTask
from .driver import WorkflowRun
from .frontier import Leaf

logger = logging.getLogger("weft_django.engine.engine")


def commit_time(owned: dict[str, Owned], batch: list[WorkflowWrites], now: datetime) -> datetime:
    """The time a fenced commit stamps (a run's end, its updated_at): the pass's ``now``, or later
    where a workflow of ``batch`` observed a later step. A local step ends at the pass time plus
    the time it ran (engine/progress.py), and the run it ends must not be stamped before it.

    Args:
        owned: the engine's held workflows; ``batch``: the commit's writes; ``now``: the pass time.
    """
    clocks = [o.run.clock for o in map(owned.get, (w.workflow_id for w in batch)) if o and o.run.clock]
    return max([now, *clocks])


@dataclasses.dataclass
class Owned:
    """A workflow this engine holds, with its live generator and what it waits for."""

    workflow_id: str
    run_id: str
    epoch: int
    run: WorkflowRun
    timers: dict[tuple[str, int], Timer] = dataclasses.field(default_factory=dict)
    inflight: dict[int, AttemptTask] = dataclasses.field(default_factory=dict)
    armed: set[int] = dataclasses.field(default_factory=set)
    dispatch: list[AttemptTask] = dataclasses.field(default_factory=list)
    stuck_attempts: int = 0
    clear_stuck: bool = False
    parent: tuple[str, str, int] | None = None  # (id, run id, seq) of the parent step waiting for us
    armed_at: dict[int, datetime] = dataclasses.field(default_factory=dict)  # when each wait began
    depth: int = 0
    trace_context: str | None = None  # the starter's (weft_django.tracing): the run's spans are its children
    history_warned: bool = False  # engine/history_size.py logged that this run's history is long
    history_limit: int | None = -1  # WEFT["HISTORY_WARN_STEPS"] as read on its first turn (-1: not yet)
    deadline: datetime | None = None  # the execution deadline armed in the loop's timer heap (never evicted)
    continued: bool = False  # a later run of its workflow id (store.histories.RunRow.continued)
    # The highest signal id this context's last mailbox read saw; the signals it consumed whose commit
    # is not durable yet; and its mailbox as known without a read (None: unknown, the next look reads
    # it), by signal id in the order they were buffered. engine/signal_delivery.py says when each is used.
    signal_top: int | None = None
    signals_taken: set[int] = dataclasses.field(default_factory=set)
    signals_known: dict[int, BufferedRow] | None = None

    @property
    def has_deadline(self) -> bool:
        return self.deadline is not None


def mailbox_of(leaf: Leaf) -> str:
    """The buffered-signal name a waiting leaf consumes: its signal, or its child's terminal record."""
    return mailbox_name(leaf.seq) if isinstance(leaf.op, StartChild) else leaf.op.name


def default_child_id(owned: Owned, seq: int) -> str:
    """The id of a child started without one at step ``seq``: ``<workflow id>/<seq>`` in the first run
    of a workflow (every run that never continued as new, and every history recorded before later
    runs had their own), ``<workflow id>/<run id>/<seq>`` in a later run of its id: of a
    continue-as-new chain, whose seqs start at 0 again, or a run started over a finished one
    (on_conflict="start_new"), whose predecessor's children keep their ids
    (``store.histories._CONTINUED_SQL``). Replay keeps the id the step recorded."""
    if owned.continued:
        return f"{owned.workflow_id}/{owned.run_id}/{seq}"
    return f"{owned.workflow_id}/{seq}"


def ends_its_child(owned: Owned, seq: int, payload: str) -> bool:
    """Whether a child-terminal record (codec text) is the end of the child that step ``seq``
    recorded starting (its step's result holds the child id while it runs). A record that cannot
    be read, or a step without a recorded id, is left to the step (it settles it, as before)."""
    step = owned.run.steps.get(seq)
    try:
        expected = decode(step.result) if step is not None and step.result is not None else None
        record = decode(payload)
        got = record.get("child_id") if isinstance(record, dict) else None
    except Exception:
        return True
    if expected is None or got is None or got == expected:
        return True
    logger.warning(
        "child-terminal record of another child ignored workflow=%s run=%s seq=%s child=%s expected=%s",
        owned.workflow_id,
        owned.run_id,
        seq,
        got,
        expected,
    )
    return False


def writes_of(owned: Owned, writes: dict[str, WorkflowWrites]) -> WorkflowWrites:
    """This workflow's writes for the next fenced commit (created empty on first use)."""
    w = writes.get(owned.workflow_id)
    if w is None:
        w = writes[owned.workflow_id] = WorkflowWrites(
            owned.workflow_id, owned.run_id, owned.epoch, parent=owned.parent
        )
    return w


def mark_stuck(
    engine_id: str,
    wid: str,
    run_id: str,
    epoch: int,
    attempts: int,
    error: WeftError,
    now: datetime,
    writes: dict[str, WorkflowWrites],
) -> None:
    """Record in ``writes`` that this workflow is stuck (its commit releases the claim; it is retried
    after a back-off), and log it.

    Args:
        engine_id: this engine (for the log).
        wid, run_id, epoch: the workflow, its run and the claim's epoch.
        attempts: how often it was stuck before.
        error: why.
        now: workflow time.
        writes: the pass's writes, by workflow id.
    """
    record, backoff = steps.stuck_record(attempts, error, now)
    logger.error(
        "workflow stuck workflow=%s engine=%s epoch=%s error=%s retry_in=%s", wid, engine_id, epoch, error, backoff
    )
    writes.setdefault(wid, WorkflowWrites(wid, run_id, epoch)).stuck = record


def collect_recorded(owned: Owned, writes: dict[str, WorkflowWrites]) -> None:
    """Move what the generator recorded by itself (memo steps, respond() answers of
    wait_for_update) into this workflow's writes for the next fenced commit."""
    run = owned.run
    if run.new_steps:
        writes_of(owned, writes).steps.extend(run.new_steps)
        run.new_steps = []
    if run.responses:
        writes_of(owned, writes).update_responses.extend(run.responses)
        run.responses = []
    if run.ctx.pending_attributes:  # ctx.set_attributes calls, in order (issue 19)
        writes_of(owned, writes).attributes.extend(run.ctx.pending_attributes)
        run.ctx.pending_attributes = []


def span_attributes(owned: Owned) -> dict[str, Any]:
    """A span's attributes naming this workflow's run."""
    return {
        "weft.workflow_id": owned.workflow_id,
        "weft.run_id": owned.run_id,
        "weft.workflow_type": owned.run.ctx.workflow_type,
        "weft.epoch": owned.epoch,
    }


def delivery_span(name: str, owned: Owned, sent: str | None, attributes: dict[str, Any]) -> Any:
    """A signal's (or update's) delivery span: a child of its sender's context, linked to the run's
    (a child of the run's when the sender's was not stored)."""
    links = [owned.trace_context] if sent else []
    carrier = sent or owned.trace_context
    values = {**span_attributes(owned), **attributes}
    return tracing.span(name, carrier=carrier, kind="CONSUMER", attributes=values, links=links)


def note_children(owned: Owned | None, writes: WorkflowWrites) -> None:
    """Before a commit that ends the run (or continues it as new): tell the store whether the run may
    have children to close, so a run that never started one skips the descendant queries."""
    if owned is not None and (writes.finish is not None or writes.continued is not None):
        writes.started_children = bool(writes.children) or owned.run.has_child_steps()
