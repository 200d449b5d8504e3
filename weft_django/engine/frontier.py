"""Where a run's code waits: its frontier, one leaf, or the branches of a ``ctx.all`` or ``ctx.race``
(engine/driver.py builds and settles it; the engine arms and settles its leaves through the driver)."""

from __future__ import annotations

import dataclasses

from ..operations import Operation
from ..store.histories import Outcome


@dataclasses.dataclass
class Leaf:
    seq: int
    op: Operation
    outcome: Outcome | None = None


@dataclasses.dataclass
class Frontier:
    """Where the code waits: one leaf, or a ctx.all/ctx.race's branches. A leaf is settled through
    ``settle_leaf`` only, which keeps the index by seq and the count of leaves still waiting: a fan-out
    of n branches settles in O(n) in all, not O(n) per branch."""

    seq: int
    op: Operation
    leaves: list[Leaf]
    by_seq: dict[int, Leaf] = dataclasses.field(init=False, repr=False)
    waiting: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.by_seq = {leaf.seq: leaf for leaf in self.leaves}
        self.waiting = sum(1 for leaf in self.leaves if leaf.outcome is None)

    def settle_leaf(self, seq: int, outcome: Outcome) -> bool:
        """Settle the waiting leaf at ``seq``; False when there is none (not a leaf, or settled already)."""
        leaf = self.by_seq.get(seq)
        if leaf is None or leaf.outcome is not None:
            return False
        leaf.outcome = outcome
        self.waiting -= 1
        return True
