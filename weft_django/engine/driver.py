"""Drives one workflow generator: replays it from the Step log by position, stops at the first
operation with no recorded outcome (the frontier), and resumes it when the engine settles that
operation. Pure logic: no database, no threads. The engine records steps; the driver checks that the
code yields the same operations at the same positions and feeds the recorded outcomes back."""

from __future__ import annotations

import traceback
from collections.abc import Generator
from datetime import datetime
from typing import Any

from ..codec import decode, encode_payload, storable_text
from ..context import WorkflowContext
from ..deterministic import Lineage
from ..exceptions import (
    ActivityError,
    ChildWorkflowError,
    CorruptPayloadError,
    EngineInternalError,
    NonDeterminismError,
    WaitTimeoutError,
    WeftError,
    WorkflowDefinitionError,
)
from ..operations import All, ContinueAsNew, Inert, Memo, Operation, Race, WaitForUpdate
from ..registry import WorkflowDefinition
from ..status import TimerKind
from ..store.histories import AppliedRecord, Outcome, StepRecord
from . import inconsistent, markers
from .frontier import Frontier, Leaf

CORRUPT_RECORD = "CorruptRecord"  # a step error meaning: what settled this step could not be read (stuck)
# The operation that arms each kind of timer a run's position can hold (engine/progress.py): a parked
# wait's timer is that operation on record there, as a step is.
TIMER_OPERATIONS: dict[str | None, str] = {
    TimerKind.SLEEP: "sleep",
    TimerKind.SIGNAL_TIMEOUT: "signal",
    TimerKind.WAIT_CONDITION: "wait_until",
    TimerKind.ACTIVITY_RETRY: "activity",
    TimerKind.ACTIVITY_TIMEOUT: "activity",
}


def error_to_exception(error: Any) -> Exception:
    """Rebuild the exception recorded for a step, identically live and on replay. A recorded error
    that is not an object of the expected shape, or names no exception weft records (``exc``),
    raises CorruptPayloadError (the run gets stuck)."""
    if not isinstance(error, dict):
        raise CorruptPayloadError(f"the recorded error is a JSON {_json_kind(error)}, not an object")
    kind = error.get("exc")
    if kind == CORRUPT_RECORD:
        raise CorruptPayloadError(_text(error, "message", "the record that settled this step could not be read"))
    if kind == "ActivityError":
        return ActivityError.from_dict(error)
    if kind == "ChildWorkflowError":
        inner = error.get("error")
        if inner is not None and not isinstance(inner, dict):
            raise CorruptPayloadError(f"the child's error is a JSON {_json_kind(inner)}, not an object")
        return ChildWorkflowError(
            _text(error, "message", ""),
            child_id=_text(error, "child_id", ""),
            status=_text(error, "status", ""),
            error=inner,
        )
    if kind == "WaitTimeoutError":
        return WaitTimeoutError(_text(error, "message", "The wait timed out."))
    # Not an error weft records (a hand edit, another program's row): throwing some exception into the
    # workflow would fail it for a reason it never had.
    raise CorruptPayloadError(f"the recorded error names no exception weft records ('exc' is {kind!r})")


def _text(error: dict[str, Any], key: str, default: str) -> str:
    value = error.get(key, default)
    if not isinstance(value, str):
        raise CorruptPayloadError(f"the recorded error's {key!r} is a JSON {_json_kind(value)}, not a string")
    return value


def _json_kind(value: Any) -> str:
    names = {str: "string", list: "array", dict: "object", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


class _Unreadable(Exception):
    """Raised inside the driver when a recorded row cannot be decoded; the run gets stuck (CorruptPayloadError)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


def _read(text: str | None, where: str) -> Any:
    try:
        return decode(text)
    except CorruptPayloadError as exc:
        raise _Unreadable(where, str(exc)) from None


def _where(seq: int, op: Operation | None = None, field: str = "result") -> str:
    if op is None:
        return f"the {field} of step {seq}"
    label = f"{op.kind} {op.name!r}" if op.name else op.kind
    return f"the {field} of step {seq} ({label})"


def read_input(text: str | None) -> tuple[list[Any], dict[str, Any]]:
    """A run's input as (args, kwargs). CorruptPayloadError when it is not codec text of
    ``{"args": [...], "kwargs": {...}}``."""
    payload = decode(text)
    if payload is None:
        return [], {}
    if not isinstance(payload, dict):
        raise CorruptPayloadError(f"the input is a {type(payload).__name__}, not {{'args': [...], 'kwargs': {{...}}}}")
    args = payload.get("args", [])
    kwargs = payload.get("kwargs", {})
    if not isinstance(args, list | tuple):
        raise CorruptPayloadError(f"the input's 'args' is a {type(args).__name__}, not a list")
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        raise CorruptPayloadError("the input's 'kwargs' is not a dict with string keys")
    return list(args), kwargs


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """An exception as weft records it: the shape of ``Workflow.error``, ``WorkflowFailedError.error``
    and an activity attempt's error (type, qualified type, message, traceback).

    Args:
        exc: the exception to describe.
    """
    return {  # storable: a message with a NUL must not make the step, run or update unwritable
        "type": storable_text(type(exc).__name__),
        "qualified_type": storable_text(f"{type(exc).__module__}.{type(exc).__qualname__}"),
        "message": storable_text(str(exc)),
        "traceback": storable_text("".join(traceback.format_exception(exc))),
    }


class WorkflowRun:
    """One live incarnation of a workflow's generator."""

    def __init__(
        self,
        definition: WorkflowDefinition,
        ctx: WorkflowContext,
        input_text: str,
        steps: dict[int, StepRecord],
        applied: list[AppliedRecord] | None = None,
        fork_origin: Any = None,
    ) -> None:
        self.definition = definition
        self.fork_origin = fork_origin  # the run row's (weft.fork): decoded into ctx.lineage by start()
        self.ctx = ctx
        self.input_text = input_text
        self.steps = steps
        # The highest recorded seq: past it the code runs live (ctx.is_replaying). Kept as steps are
        # recorded (record, _record_new) instead of scanning every step on each turn, which made a run
        # of n steps cost n * n / 2 in the loop's thread, live or replayed.
        self._last_recorded = max(steps, default=-1)
        self.new_steps: list[StepRecord] = []  # recorded by the driver itself (memo, race winners)
        self.next_seq = 0
        self.frontier: Frontier | None = None
        self.result_text: str | None = None
        self.failure: dict[str, Any] | None = None
        self.stuck: WeftError | None = None
        self._gen: Generator[Any, Any, Any] | None = None
        # The last step error thrown into the code, so a run it ends records which step failed (retry()).
        self._last_thrown: tuple[BaseException, int] | None = None
        # Applied updates by the seq they arrived at, in n order (recorded ones first, then live ones).
        self.applied: dict[int, list[AppliedRecord]] = {}
        for record in sorted(applied or (), key=lambda r: (r.seq, r.n)):
            self.applied.setdefault(record.seq, []).append(record)
        self._last_applied = max(self.applied, default=-1)  # kept by record_applied, as _last_recorded
        # respond() answers of wait_for_update, for the next fenced commit: (update id, result text).
        self.responses: list[tuple[str, str]] = []
        # Positions this run's timers hold (the loader's), with the timer's kind (None: not known): a patch
        # before them is the old branch, and the operation yielded there must be the one that armed it.
        self._occupied: dict[int, str | None] = {}
        self._last_occupied = -1
        # Workflow time (ctx.now()): the latest durable time of a step fed to the code (from the run's
        # start, a fork's source's below its fork point: start() sets it from ctx.lineage).
        self.clock: datetime | None = ctx.started_at
        self.in_code = False  # the generator's own code is running (ctx.patched, ctx.random)
        self.check_only = False  # a replay check: stop at a memo with no record instead of computing it
        self.continued: ContinueAsNew | None = None  # the code continued as new (yielded or returned it)
        ctx.history = markers.DriverHistory(self)

    @property
    def occupied(self) -> dict[int, str | None]:
        return self._occupied

    @occupied.setter
    def occupied(self, timers: dict[int, str | None]) -> None:
        self._occupied, self._last_occupied = timers, max(timers, default=-1)

    @property
    def last_position(self) -> int:
        """The highest position this run recorded anything at (a step, a timer, an applied update), or
        -1: kept as they are recorded, so ``ctx.patched`` on the live path does not scan the history."""
        return max(self._last_recorded, self._last_occupied, self._last_applied)

    def start_at(self, position: int) -> datetime | None:
        """The start ``ctx.now()`` counts from at ``position`` (markers.MarkedRun)."""
        return self.ctx.lineage.start(self.ctx.started_at, position)

    @property
    def finished(self) -> bool:
        return (
            self.result_text is not None
            or self.failure is not None
            or self.stuck is not None
            or self.continued is not None
        )

    @property
    def completed(self) -> bool:
        return self.result_text is not None

    # -- driving ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the generator and replay it to its frontier. Never raises: an input that cannot be
        decoded fails the run (no code can run without its arguments); a recorded row that cannot be
        decoded, or a failure of the driver itself, makes it stuck (see docs/reliability.md)."""
        try:
            args, kwargs = read_input(self.input_text)
        except CorruptPayloadError as exc:
            self.failure = describe_exception(
                CorruptPayloadError(
                    f"Workflow {self.ctx.workflow_id!r} cannot start: its stored input cannot be decoded ({exc}). "
                    "Nothing of this run can execute without its arguments; start a new run with a valid input."
                )
            )
            return
        try:
            self.ctx.lineage = Lineage.from_json(self.fork_origin, self.ctx.run_id)
        except CorruptPayloadError as exc:
            self.failure = describe_exception(
                CorruptPayloadError(
                    f"Workflow {self.ctx.workflow_id!r} cannot start: {exc}. Its kept steps cannot be replayed with "
                    "the values its source saw; fork the source again."
                )
            )
            return
        self.clock = self.ctx.lineage.start(self.ctx.started_at, 0)
        try:
            self._gen = self.definition.fn(self.ctx, *args, **kwargs)
        except Exception as exc:  # a TypeError for wrong arguments, say
            self.failure = describe_exception(exc)
            return
        self._guarded(lambda: self._advance(None, None))

    def settle(self, seq: int, outcome: Outcome) -> None:
        """The engine settled the frontier leaf at ``seq`` (and recorded its step). Never raises (as start())."""
        frontier = self.frontier
        if frontier is None:
            return
        if frontier.settle_leaf(seq, outcome):
            self._guarded(self._settle_frontier)

    def _guarded(self, drive: Any) -> None:
        """Run ``drive``; what escapes it is not the workflow code's failure (that is caught where the
        generator runs) but a row that cannot be decoded or a driver bug: the run gets stuck with it."""
        try:
            drive()
        except _Unreadable as exc:
            self._get_stuck(self._corrupt(exc))
        except Exception as exc:
            self._get_stuck(
                EngineInternalError(
                    f"Workflow {self.ctx.workflow_id!r}: the engine failed while driving it "
                    f"({type(exc).__name__}: {exc}). This is a bug in weft_django, not in the workflow code; "
                    "the engine retries it with back-off. Please report it with the engine's log."
                )
            )

    def pending_leaves(self) -> list[Leaf]:
        """The leaves of the frontier still waiting; none once the run is closed (its execution deadline passed
        in this pass: what its code reached may not be armed, a local activity run or a child started)."""
        if self.frontier is None or self.ctx.detached:
            return []
        return [leaf for leaf in self.frontier.leaves if leaf.outcome is None]

    def pending_leaf(self, seq: int) -> Leaf | None:
        """The frontier's leaf at ``seq`` if it is still waiting (as ``pending_leaves``), else None."""
        if self.frontier is None or self.ctx.detached:
            return None
        leaf = self.frontier.by_seq.get(seq)
        return leaf if leaf is not None and leaf.outcome is None else None

    def is_pending(self, seq: int) -> bool:
        return self.pending_leaf(seq) is not None

    def record(self, step: StepRecord) -> None:
        self.steps[step.seq] = step
        self._last_recorded = max(self._last_recorded, step.seq)

    def has_child_steps(self) -> bool:
        """Whether this run has started a child (a child step recorded, or just recorded)."""
        return any(step.kind == "child" for step in self.steps.values())

    def record_applied(self, name: str, payload: str, result: str | None, error: Any, update_id: str) -> AppliedRecord:
        """An update handler just ran live at the frontier: note it where replay will re-apply it."""
        assert self.frontier is not None
        seq = self.frontier.seq
        done = self.applied.setdefault(seq, [])
        self._last_applied = max(self._last_applied, seq)
        record = AppliedRecord(seq, len(done), name, payload, result, error, update_id)
        done.append(record)
        return record

    def close(self) -> None:
        """Detach the context first, so a ``finally`` that yields gets an inert operation."""
        self.ctx.detached = True
        gen, self._gen = self._gen, None
        if gen is not None:
            try:
                gen.close()
            except RuntimeError:  # the generator yielded in its finally block
                pass
            except Exception:  # noqa: S110 - user cleanup code failing while closed is not ours to raise
                pass

    # -- internals ----------------------------------------------------------------------------
    def _corrupt(self, exc: _Unreadable) -> CorruptPayloadError:
        return CorruptPayloadError(
            f"Workflow {self.ctx.workflow_id!r} cannot continue: {exc.where} cannot be decoded ({exc.reason}). "
            "Repair that row (the admin and `weft describe` show the step), or cancel the workflow; the engine "
            "retries it with back-off and serves its other workflows meanwhile."
        )

    def _settle_frontier(self) -> None:
        frontier = self.frontier
        assert frontier is not None
        op = frontier.op
        if isinstance(op, Race):
            winner = next((i for i, leaf in enumerate(frontier.leaves) if leaf.outcome is not None), None)
            if winner is None:
                return
            self._record_new(StepRecord(frontier.seq, "race", "", "completed", encode_payload(winner)))
            outcome = frontier.leaves[winner].outcome
            assert outcome is not None
            self.frontier = None
            leaf = frontier.leaves[winner]
            self._observe(leaf.seq)
            if outcome.ok:
                self._advance((winner, _read(outcome.text, _where(leaf.seq, leaf.op))), None)
            else:
                self._advance(None, self._thrown(outcome.error, leaf.seq, leaf.op))
            return
        if frontier.waiting:
            return
        self.frontier = None
        self._observe(*(leaf.seq for leaf in frontier.leaves))
        failed = next((leaf for leaf in frontier.leaves if leaf.outcome is not None and not leaf.outcome.ok), None)
        if failed is not None:
            assert failed.outcome is not None
            self._advance(None, self._thrown(failed.outcome.error, failed.seq, failed.op))
        elif isinstance(op, All):
            values = [_read(lf.outcome.text, _where(lf.seq, lf.op)) for lf in frontier.leaves if lf.outcome is not None]
            self._advance(values, None)
        else:
            only = frontier.leaves[0]
            assert only.outcome is not None
            self._advance(self._value(op, only.outcome.text, only.seq), None)

    def _thrown(self, error: Any, seq: int, op: Operation | None = None) -> Exception:
        try:
            exc = error_to_exception(error)
        except CorruptPayloadError as corrupt:
            raise _Unreadable(_where(seq, op, "error"), str(corrupt)) from None
        self._last_thrown = (exc, seq)
        return exc

    def _record_new(self, step: StepRecord) -> None:
        self.steps[step.seq] = step
        self._last_recorded = max(self._last_recorded, step.seq)
        self.new_steps.append(step)

    def record_marker(self, step: StepRecord) -> None:
        """A patch marker the code just took (engine/markers.py): written with the next fenced commit."""
        self._record_new(step)

    def _observe(self, *seqs: int) -> None:
        """The code is fed the outcomes of the steps at ``seqs``: workflow time moves to their durable
        completion (driver-recorded steps carry none: their row's time is the commit's)."""
        for seq in seqs:
            step = self.steps.get(seq)
            if step is None or step.completed_at is None or step.kind in markers.DRIVER_KINDS:
                continue
            if self.clock is None or step.completed_at > self.clock:
                self.clock = step.completed_at

    def _advance(self, value: Any, exc: BaseException | None) -> None:
        gen = self._gen
        if gen is None:
            return
        while True:
            self.ctx.is_replaying = self._last_recorded >= self.next_seq
            self.in_code = True
            try:
                op = gen.throw(exc) if exc is not None else gen.send(value)
            except StopIteration as stop:
                self._finish_ok(stop.value)
                return
            except Exception as error:  # workflow code failed: the run fails
                self.failure = describe_exception(error)
                if self._last_thrown is not None and self._last_thrown[0] is error:
                    self.failure["seq"] = self._last_thrown[1]
                self._gen = None
                return
            finally:
                self.in_code = False
            value, exc = None, None
            if isinstance(op, Inert):
                continue
            if isinstance(op, ContinueAsNew):
                self._continue(op)
                return
            if not isinstance(op, Operation):
                exc = TypeError(
                    f"Workflow code yielded {op!r}; yield an operation such as ctx.run(...), ctx.sleep(...) "
                    f"or ctx.wait_for_signal(...)."
                )
                continue
            seq = self.next_seq = markers.skip_unasked(self.steps, self.next_seq)
            mismatch = self._mismatch(seq, op)
            if mismatch:
                self._get_stuck(NonDeterminismError(mismatch))
                return
            self.next_seq += op.width
            if seq in self.applied and not self._reapply(seq):
                return
            if isinstance(op, Memo):
                if self.check_only and seq not in self.steps:
                    self.frontier = Frontier(seq, op, [Leaf(seq, op)])
                    return
                value, exc = self._memo(seq, op)
                continue
            resolved = self._from_log(seq, op)
            if resolved is not None:
                value, exc = resolved
                continue
            self.ctx.is_replaying = False
            if self._last_applied > seq:  # an update recorded where the run never was: replay would diverge
                self._get_stuck(inconsistent.applied_past(self.ctx.workflow_id, self.applied, seq))
                return
            self.frontier = self._frontier(seq, op)
            if isinstance(op, Race) and any(leaf.outcome is not None for leaf in self.frontier.leaves):
                self._settle_frontier()
            return

    def _continue(self, op: ContinueAsNew) -> None:
        """The run ends here and a fresh run follows (its writes: engine/progress.py, store/continuation.py)."""
        self.continued = op
        self.close()

    def _finish_ok(self, value: Any) -> None:
        if isinstance(value, ContinueAsNew):  # `return ctx.continue_as_new(...)`
            self._gen = None
            self.continued = value
            return
        self._gen = None
        try:
            self.result_text = encode_payload(value, path="result")
        except WeftError as error:
            self.failure = describe_exception(error)

    def _get_stuck(self, error: WeftError) -> None:
        self.stuck = error
        self.close()

    def _mismatch(self, seq: int, op: Operation) -> str | None:
        expected: list[tuple[int, Operation]] = [(seq, op)]
        if isinstance(op, All | Race):
            expected += [(seq + 1 + i, branch) for i, branch in enumerate(op.branches)]
            if isinstance(op, All):
                expected = expected[1:]
        for position, operation in expected:
            recorded, timer = self.steps.get(position), self.occupied.get(position)
            if recorded is not None and (recorded.kind != operation.kind or recorded.name != operation.name):
                there = f"the recorded history has {recorded.kind} {recorded.name!r} there"
            elif recorded is None and TIMER_OPERATIONS.get(timer, operation.kind) != operation.kind:
                there = f"the run has a {timer} timer armed there"  # a parked wait's only record
            else:
                continue
            return (
                f"Workflow {self.ctx.workflow_id!r} yielded {operation.kind} {operation.name!r} at step "
                f"{position}, but {there}. Workflow code must yield the same operations in the same order for "
                f"the same results; deploy code that matches the running version, or start new runs under a new "
                f"workflow version."
            )
        return None

    def _memo(self, seq: int, op: Memo) -> tuple[Any, BaseException | None]:
        recorded = self.steps.get(seq)
        if recorded is not None and recorded.settled:
            return _read(recorded.result, _where(seq, op)), None
        try:
            text = encode_payload(op.compute(), path=f"memo {op.key!r}")
        except Exception as error:
            return None, error
        self._record_new(StepRecord(seq, "memo", op.key, "completed", text))
        return decode(text), None

    def _from_log(self, seq: int, op: Operation) -> tuple[Any, BaseException | None] | None:
        if isinstance(op, Race):
            recorded = self.steps.get(seq)
            if recorded is None or not recorded.settled:
                return None
            winner = _read(recorded.result, _where(seq, op))
            if type(winner) is not int or not 0 <= winner < len(op.branches):
                reason = f"{winner!r} is not the index of one of its {len(op.branches)} branches"
                raise _Unreadable(_where(seq, op), reason)
            branch = op.branches[winner]
            step = self.steps.get(seq + 1 + winner)
            if step is None or not step.settled:
                return None
            self._observe(seq + 1 + winner)
            if step.status == "failed":
                return None, self._thrown(step.error, seq + 1 + winner, branch)
            return (winner, _read(step.result, _where(seq + 1 + winner, branch))), None
        if isinstance(op, All):
            steps = [self.steps.get(seq + 1 + i) for i in range(len(op.branches))]
            if not all(step is not None and step.settled for step in steps):
                return None
            self._observe(*range(seq + 1, seq + 1 + len(op.branches)))
            for i, step in enumerate(steps):
                assert step is not None
                if step.status == "failed":
                    return None, self._thrown(step.error, seq + 1 + i, op.branches[i])
            where = [_where(seq + 1 + i, branch) for i, branch in enumerate(op.branches)]
            return [_read(step.result, where[i]) for i, step in enumerate(steps) if step is not None], None
        recorded = self.steps.get(seq)
        if recorded is None or not recorded.settled:
            return None
        self._observe(seq)
        if recorded.status == "failed":
            return None, self._thrown(recorded.error, seq, op)
        return self._value(op, recorded.result, seq), None

    # -- updates ------------------------------------------------------------------------------
    def _value(self, op: Operation, text: str | None, seq: int) -> Any:
        """What the yield returns for a recorded result: for wait_for_update, ``(payload, respond)``."""
        value = _read(text, _where(seq, op))
        if not isinstance(op, WaitForUpdate):
            return value
        recorded = value if value is not None else {}
        if not isinstance(recorded, dict):
            raise _Unreadable(_where(seq, op), f"a {type(recorded).__name__}, not {{'update_id', 'payload'}}")
        return recorded.get("payload"), self._responder(op.name, str(recorded.get("update_id", "")))

    def _responder(self, name: str, update_id: str) -> Any:
        answered = False

        def respond(result: Any = None) -> None:
            """Answer the caller of this update (recorded in the next fenced commit; a no-op on replay)."""
            nonlocal answered
            if answered or self.ctx.detached or self.ctx.is_replaying:
                return
            if self.ctx.read_only is not None:  # a query handler or a validator: not recorded, not replayed
                raise WorkflowDefinitionError(f"respond() may not be called from {self.ctx.read_only}.")
            text = encode_payload(result, path=f'respond() of update "{name}"')
            answered = True
            self.responses.append((update_id, text))

        return respond

    def _reapply(self, seq: int) -> bool:
        """Re-apply the updates recorded at ``seq`` (replay), without validators. False when stuck."""
        previous, self.ctx.is_replaying = self.ctx.is_replaying, True
        try:
            for record in self.applied[seq]:
                entry = self.ctx.update_handlers.get(record.name)
                if entry is None:
                    self._get_stuck(
                        NonDeterminismError(
                            f"Workflow {self.ctx.workflow_id!r} applied update {record.name!r} at step {seq}, but "
                            f"the code has no ctx.on_update({record.name!r}, ...) handler registered there now. "
                            f"Deploy code that registers it before that step, or start new runs under a new version."
                        )
                    )
                    return False
                payload = _read(record.payload, f"the payload of update {record.name!r} applied at step {seq}")
                try:
                    entry[0](payload)
                except Exception:  # noqa: S112 - it raised live too; that outcome is recorded already
                    continue
        finally:
            self.ctx.is_replaying = previous
        return True

    def _frontier(self, seq: int, op: Operation) -> Frontier:
        if isinstance(op, All | Race):
            leaves = []
            for i, branch in enumerate(op.branches):
                step = self.steps.get(seq + 1 + i)
                leaves.append(Leaf(seq + 1 + i, branch, step.outcome if step is not None and step.settled else None))
            return Frontier(seq, op, leaves)
        return Frontier(seq, op, [Leaf(seq, op)])
