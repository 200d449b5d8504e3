"""fenced_commit: the ONLY way an engine writes workflow-scoped state (its batch commit). The fenced
commit itself (the claim lock first, in workflow_id order, then the writes; the one-statement commit
on PostgreSQL) is ``weft_django.store.commit``; the claim locks are ``weft_django.store.claims``.
What stays here is the engine's side: what a commit calls back (closing an ended run's children, the
event of a child run started). The other names are re-exported until their callers import the store.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .. import events
from ..store import commit
from ..store.commit import FenceResult, WorkflowWrites
from ..transitions import close_children

__all__ = ["fenced_commit"]

# A run that ends closes its children through the transitions (parent_close_policy); a child started
# raises the engine's event.
_HOOKS = commit.CommitHooks(close_children=close_children, child_started=events.child_started)


def fenced_commit(
    engine_id: str, batch: list[WorkflowWrites], now: datetime, using: str, claim_ttl: timedelta | None = None
) -> FenceResult:
    """Commit every workflow's writes whose claim this engine still holds at the stated epoch
    (``store.commit.fenced_commit``): a run that ends closes its children (``transitions.close_children``,
    their parent_close_policy), and each child run the batch starts raises ``workflow_started`` (sent
    once the commit lands).

    Args:
        engine_id: the committing engine; ``batch``: the workflows' writes; ``now``: workflow time.
        using: the connection alias; ``claim_ttl``: the TTL of children's claims.

    Raises:
        UpdateRaceLost: an update settled in the batch was no longer admitted (all rolled back).
        django.db.DatabaseError: a statement failed.
    """
    return commit.fenced_commit(engine_id, batch, now, using, claim_ttl, hooks=_HOOKS)
