"""What a workflow's deterministic helpers rest on: ``ctx.patched`` / ``ctx.deprecate_patch`` (safe
deploys), ``ctx.now()``, ``ctx.random()`` and ``ctx.uuid4()``.

The context (context.py) asks the driver that replays it through ``RunHistory``: where the
generator is in its step log (``position``), whether a change id was taken there (``patched``), and
the run's workflow time (``now``). Random values are seeded, not recorded: the generator at the same
position of the same run draws the same numbers live and on replay (``seeded_random``).
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime
from typing import Protocol

from .codec import is_storable
from .exceptions import WorkflowDefinitionError

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
