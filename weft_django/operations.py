"""Operation descriptors: what workflow code yields. Each names its kind and name, which replay
checks against the Step recorded at the same position (a mismatch is a NonDeterminismError)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

from .registry import ActivityDefinition

_CALLS = {
    "activity": "ctx.run",
    "sleep": "ctx.sleep",
    "signal": "ctx.wait_for_signal",
    "update": "ctx.wait_for_update",
    "wait_until": "ctx.wait_until",
    "memo": "ctx.memo",
    "child": "ctx.start_child",
    "all": "ctx.all",
    "race": "ctx.race",
    "continue_as_new": "ctx.continue_as_new",
}


class Operation:
    kind: ClassVar[str] = ""

    def _not_a_result(self) -> str:
        call = _CALLS.get(self.kind, "ctx.run")
        return (
            f"{call}(...) returns an operation for the engine, not its result: yield it, as in "
            f"`result = yield {call}(...)` (a {type(self).__name__} was used as if it were the result; "
            f"every ctx operation in a workflow needs `yield`)."
        )

    def __getitem__(self, key: Any) -> Any:
        # Also what `for x in op` and `x in op` reach (the old sequence protocol).
        raise TypeError(self._not_a_result())

    def __getattr__(self, name: str) -> Any:
        # Only for names the operation does not have; dunder and private lookups stay plain.
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}. {self._not_a_result()}")

    @property
    def name(self) -> str:
        return ""

    @property
    def width(self) -> int:
        """How many seqs the operation takes: one, plus one per branch for composites."""
        return 1


@dataclasses.dataclass(frozen=True, eq=False)
class RunActivity(Operation):
    kind: ClassVar[str] = "activity"
    activity: ActivityDefinition
    args_text: str  # codec text of {"args": [...], "kwargs": {...}}, encoded when yielded

    @property
    def name(self) -> str:
        return self.activity.name


@dataclasses.dataclass(frozen=True, eq=False)
class Sleep(Operation):
    kind: ClassVar[str] = "sleep"
    duration: timedelta


@dataclasses.dataclass(frozen=True, eq=False)
class WaitForSignal(Operation):
    kind: ClassVar[str] = "signal"
    signal: str
    timeout: timedelta | None

    @property
    def name(self) -> str:
        return self.signal


@dataclasses.dataclass(frozen=True, eq=False)
class WaitForUpdate(Operation):
    kind: ClassVar[str] = "update"
    update: str

    @property
    def name(self) -> str:
        return self.update


@dataclasses.dataclass(frozen=True, eq=False)
class WaitUntil(Operation):
    kind: ClassVar[str] = "wait_until"
    predicate: Callable[[], Any]
    timeout: timedelta | None


@dataclasses.dataclass(frozen=True, eq=False)
class Memo(Operation):
    kind: ClassVar[str] = "memo"
    key: str
    compute: Callable[[], Any]

    @property
    def name(self) -> str:
        return self.key


@dataclasses.dataclass(frozen=True, eq=False)
class StartChild(Operation):
    kind: ClassVar[str] = "child"
    workflow_type: str
    version: str
    input_text: str
    child_id: str | None
    parent_close_policy: str
    queue: str | None = None  # the queue the child waits in (weft_django.queueing), its priority and key
    priority: int = 0
    concurrency_key: str | None = None

    @property
    def name(self) -> str:
        return self.workflow_type


@dataclasses.dataclass(frozen=True, eq=False)
class All(Operation):
    kind: ClassVar[str] = "all"
    branches: tuple[Operation, ...]

    @property
    def width(self) -> int:
        return 1 + len(self.branches)


@dataclasses.dataclass(frozen=True, eq=False)
class Race(Operation):
    kind: ClassVar[str] = "race"
    branches: tuple[Operation, ...]

    @property
    def width(self) -> int:
        return 1 + len(self.branches)


class Inert(Operation):
    """Yielded by a detached context (a generator being closed): the engine ignores it."""

    kind: ClassVar[str] = "inert"


LEAF_KINDS = (RunActivity, Sleep, WaitForSignal, StartChild)


@dataclasses.dataclass(frozen=True, eq=False)
class ContinueAsNew(Operation):
    """End this run and start a fresh run of the same workflow id with this input (yield or return it)."""

    kind: ClassVar[str] = "continue_as_new"
    input_text: str
    version: str
