"""What a workflow's deterministic helpers rest on: ``ctx.patched`` / ``ctx.deprecate_patch`` (safe
deploys), ``ctx.now()``, ``ctx.random()`` and ``ctx.uuid4()``.

The context (context.py) asks the driver that replays it through ``RunHistory``: where the
generator is in its step log (``position``), whether a change id was taken there (``patched``), and
the run's workflow time (``now``). Random values are seeded, not recorded: the generator at the same
position of the same run draws the same numbers live and on replay (``seeded_random``).

A run ``weft.fork`` made keeps its source's values below the fork point (``Lineage``): its kept steps
replay as the source's did, with the source's seeds and start time, and the code from the fork point
on draws the fork's own.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from datetime import datetime
from typing import Any, Protocol

from .codec import is_storable
from .exceptions import CorruptPayloadError, WorkflowDefinitionError

PATCH_ID_MAX = 255  # Step.name


class RunHistory(Protocol):
    """The driver's side of a context (engine/markers.py implements it)."""

    @property
    def position(self) -> int:
        """The seq the next operation (or patch marker) takes."""
        ...

    def in_code(self) -> bool:
        """Whether the workflow function's own code is running (not a handler between turns)."""
        ...

    def patched(self, change_id: str, *, deprecated: bool) -> bool:
        """Whether this run takes the new branch of ``change_id``, recording the marker if it is new."""
        ...

    def now(self) -> datetime:
        """Workflow time: the latest durable time the code has observed."""
        ...


def check_patch_id(change_id: object, call: str) -> str:
    """A change id as ``ctx.patched`` / ``ctx.deprecate_patch`` take it.

    Args:
        change_id: what the code passed.
        call: the call's name, for the message.

    Raises:
        WorkflowDefinitionError: not a non-empty string of at most 255 characters without NUL or
            unpaired surrogates (the marker step's name: the database could not store it).
    """
    if (
        not isinstance(change_id, str)
        or not change_id.strip()
        or len(change_id) > PATCH_ID_MAX
        or not is_storable(change_id)
    ):
        raise WorkflowDefinitionError(
            f"{call} takes a change id: a non-empty string of at most {PATCH_ID_MAX} characters, without NUL or "
            f'unpaired surrogates, that names the change, as in ctx.patched("charge-before-ship") (got {change_id!r}).'
        )
    return change_id


def seeded_random(run_id: str, position: int) -> random.Random:
    """The generator ``ctx.random()`` returns at ``position`` of run ``run_id``: seeded from both (a
    string seed hashes with SHA-512, the same in every process whatever PYTHONHASHSEED is), so replay
    draws the numbers the live run drew, and a draw added later in the code changes no earlier one.

    Args:
        run_id: the run.
        position: the seq the generator is at.
    """
    return random.Random(f"weft:{run_id}:{position}")


def uuid4_from(rng: random.Random) -> uuid.UUID:
    """A version-4 UUID drawn from ``rng`` (deterministic, not for secrets)."""
    return uuid.UUID(int=rng.getrandbits(128), version=4)


@dataclasses.dataclass(frozen=True)
class Lineage:
    """Where a run's deterministic values come from below its fork point(s): ``segments`` are
    ``(upto, seed_run_id, started_at)``, ``upto`` increasing; a position below a segment's ``upto``
    (and not below the previous one's) draws ``ctx.random()`` from ``seed_run_id``'s seed and takes
    ``started_at`` as the start of ``ctx.now()``; positions past the last take the run's own. A run that
    is not a fork (or a fork from step 0) has none. Stored as the run row's ``fork_origin``
    (``to_json``), which names the run it belongs to: a later run of the workflow id (continued as
    new, started again) has its own values."""

    segments: tuple[tuple[int, str, datetime | None], ...] = ()

    def seed(self, run_id: str, position: int) -> str:
        """The run id whose seed ``ctx.random()`` uses at ``position`` of run ``run_id``."""
        for upto, seed_run, _ in self.segments:
            if position < upto:
                return seed_run
        return run_id

    def start(self, started_at: datetime | None, position: int) -> datetime | None:
        """The start time ``ctx.now()`` counts from at ``position`` of a run started at ``started_at``."""
        for upto, _, start in self.segments:
            if position < upto:
                return start
        return started_at

    def forked(self, run_id: str, started_at: datetime | None, upto: int) -> Lineage:
        """The lineage of a fork of run ``run_id`` (of this lineage, started at ``started_at``) that
        keeps its first ``upto`` positions."""
        kept: list[tuple[int, str, datetime | None]] = []
        below = 0
        for end, seed_run, start in self.segments:
            if below >= upto:
                break
            kept.append((min(end, upto), seed_run, start))
            below = min(end, upto)
        if below < upto:
            kept.append((upto, run_id, started_at))
        return Lineage(tuple(kept))

    def to_json(self, run_id: str) -> dict[str, Any] | None:
        """The ``fork_origin`` column of run ``run_id`` (None: no lineage)."""
        if not self.segments:
            return None
        below = [
            [upto, seed_run, start.isoformat() if start is not None else None]
            for upto, seed_run, start in self.segments
        ]
        return {"run": str(run_id), "below": below}

    @classmethod
    def from_json(cls, value: Any, run_id: str) -> Lineage:
        """The lineage ``fork_origin`` holds for run ``run_id``: none when it is empty or names another
        run (the row's earlier run).

        Raises:
            CorruptPayloadError: not what ``to_json`` writes (a hand edit).
        """
        if value is None:
            return cls()
        try:
            if not isinstance(value, dict) or not isinstance(value.get("run"), str):
                raise ValueError("not an object naming its run")
            if value["run"] != str(run_id):
                return cls()
            segments: list[tuple[int, str, datetime | None]] = []
            below = 0
            for upto, seed_run, start in value["below"]:
                if (
                    isinstance(upto, bool)
                    or not isinstance(upto, int)
                    or upto <= below
                    or not isinstance(seed_run, str)
                ):
                    raise ValueError(f"bad segment {[upto, seed_run, start]!r}")
                when = datetime.fromisoformat(start) if start is not None else None
                if when is not None and when.utcoffset() is None:
                    raise ValueError(f"naive start time {start!r}")
                segments.append((upto, seed_run, when))
                below = upto
            return cls(tuple(segments))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptPayloadError(f"the run's fork origin {value!r:.200} is not valid ({exc})") from None
