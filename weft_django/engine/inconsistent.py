"""Histories whose rows disagree with one another (a hand edit): the run is made stuck with what is
wrong, instead of replaying into a state it never had."""

from __future__ import annotations

from ..exceptions import CorruptPayloadError
from ..store.histories import AppliedRecord


def applied_past(workflow_id: str, applied: dict[int, list[AppliedRecord]], frontier: int) -> CorruptPayloadError:
    """An update recorded as applied at a step past the frontier replay reached: the run was never
    there (an update is applied at the step the run waits at), so replay would leave its handler's
    effect out, silently, and re-apply it later, where it never ran."""
    seq = max(applied)
    names = ", ".join(repr(record.name) for record in applied[seq])
    return CorruptPayloadError(
        f"Workflow {workflow_id!r} cannot continue: update {names} is recorded as applied at step {seq}, but "
        f"replaying its history waits at step {frontier}: the run never reached step {seq}, so its history is "
        "inconsistent (a hand edit?). Repair that applied update's row (its seq), or cancel the workflow; the "
        "engine retries it with back-off and serves its other workflows meanwhile."
    )


__all__ = ["applied_past"]
