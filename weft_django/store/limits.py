"""Activity limits across engines (``@weft.activity(concurrency=, rate=, concurrency_key=)``): slots
taken at dispatch and released after the attempt, in ``ActivitySlot`` rows, serialised per activity.

A slot counts while it is not released AND its workflow's claim is still at the slot's epoch with the
slot's engine: a frozen or killed engine's slots stop counting as soon as its claims are taken over
(or released), with no heartbeat involved; a thawed engine's old slots never count again (new epoch).
The rate counts every slot taken inside the window, released or not.

A slot is dispatch bookkeeping, not workflow state (replay never reads it), so it is not a fenced
write: it takes no claim lock at all (it is fenced by the epoch join instead), only the activity's own
lock (``Backend.try_lock_name``, never waited for), and so stays off the claims' lock order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from ..flow import Rate
from ..models import ActivitySlot, WorkflowClaim
from .backend import backend
from .clock import db_now
from .sessions import write_unlocked

SLOT_LOCKS = 0x77656661  # the advisory-lock namespace of activity slots ("wefa")
KEEP = timedelta(minutes=1)  # released slots stay at least this long (longer for a longer rate window)


@dataclass(frozen=True)
class SlotRequest:
    """One attempt asking for a slot, and the activity's limits."""

    activity: str
    key: str | None
    workflow_id: str
    run_id: str
    seq: int
    attempt: int
    epoch: int
    concurrency: int | None
    rate: Rate | None
    per_key: int


def _live(activity: str, using: str) -> QuerySet[ActivitySlot]:
    held = WorkflowClaim.objects.using(using).filter(
        workflow_id=OuterRef("workflow_id"), epoch=OuterRef("epoch"), engine_id=OuterRef("engine_id")
    )
    return ActivitySlot.objects.using(using).filter(activity=activity, released_at__isnull=True).filter(Exists(held))


def take_slot(engine_id: str, request: SlotRequest, using: str) -> tuple[int | None, str]:
    """Take a slot for this attempt if the activity's limits allow it now.

    Args:
        engine_id: the dispatching engine (it holds the workflow's claim at ``request.epoch``).
        request: the attempt and the limits.
        using: the connection alias.

    Returns:
        (the slot's id, "") or (None, why: "concurrency", "rate", "key", or "busy": another transaction
        holds the activity's lock, never waited for (an engine stopped holding it stalls no one); the
        attempt waits in its engine and is tried again, as for a refusal).

    Raises:
        django.db.DatabaseError: a statement failed (nothing taken).
    """
    with transaction.atomic(using=using):
        if not backend(using).try_lock_name(SLOT_LOCKS, request.activity):
            return None, "busy"  # another transaction holds the activity's lock: the attempt waits, tried again
        now = db_now(using)
        live = _live(request.activity, using)
        if request.concurrency is not None and live.count() >= request.concurrency:
            return None, "concurrency"
        slots = ActivitySlot.objects.using(using).filter(activity=request.activity)
        if (
            request.rate is not None
            and slots.filter(acquired_at__gt=now - request.rate.period).count() >= request.rate.limit
        ):
            return None, "rate"
        if request.key is not None and live.filter(key=request.key).count() >= request.per_key:
            return None, "key"
        keep = max(KEEP, request.rate.period if request.rate is not None else KEEP)
        old = slots.filter(acquired_at__lt=now - keep)
        # One a user's open transaction holds is left for a later take: never waited for (the engine's loop).
        write_unlocked(old.filter(Q(released_at__isnull=False) | ~Q(pk__in=live.values("pk"))), None, using)
        slot = ActivitySlot.objects.using(using).create(
            activity=request.activity,
            key=request.key,
            workflow_id=request.workflow_id,
            run_id=request.run_id,
            seq=request.seq,
            attempt=request.attempt,
            epoch=request.epoch,
            engine_id=engine_id,
            acquired_at=now,
        )
        return int(slot.pk), ""


def release_slots(slot_ids: list[int], using: str) -> set[int]:
    """Release these slots (their attempts ended or were dropped), at the database clock, but those whose
    row another transaction holds (a user's open transaction): never waited for, on the engine's loop.
    Returns the slots left unreleased for that reason (to be released later)."""
    if not slot_ids:
        return set()
    rows = ActivitySlot.objects.using(using).filter(pk__in=slot_ids)
    with transaction.atomic(using=using):
        if not backend(using).skips_locked:
            rows.filter(released_at__isnull=True).update(released_at=db_now(using))
            return set()
        free = sorted(rows.select_for_update(skip_locked=True, no_key=True).values_list("pk", flat=True))
        if free:
            rows.filter(pk__in=free, released_at__isnull=True).update(released_at=db_now(using))
        held = sorted(set(slot_ids) - set(free))
        return set(rows.filter(pk__in=held).values_list("pk", flat=True)) if held else set()


def slot_stats(using: str) -> list[dict[str, object]]:
    """Per activity with slots: how many count now, and the keys in use (admin, CLI)."""
    found = []
    names = ActivitySlot.objects.using(using).values_list("activity", flat=True).distinct()
    for name in sorted(set(names)):
        live = list(_live(name, using).values_list("key", flat=True))
        found.append({"activity": name, "running": len(live), "keys": sorted({k for k in live if k is not None})})
    return found
