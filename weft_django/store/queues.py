"""Queue admission (docs/queues.md, ADR 0011): a run started in a queue waits ``pending`` until an
engine admits it; admission makes it ``running``, stamps ``admitted_at`` (the database clock) and makes
the admitting engine its holder, in one transaction serialised per queue.

The transaction, in this order:

1. the queue's lock, never waited for (``Backend.try_lock_name``: a transaction-scoped advisory lock
   on PostgreSQL, ``pg_try_advisory_xact_lock``; on SQLite the IMMEDIATE transaction is the one write
   lock): when another transaction holds it, admission skips the queue this pass (returns nothing)
   and the engine tries again on its next pass, so an engine stopped while holding it stalls no one.
   A lock, not a write: the lock-order rule (claims first, before any write) still holds, and no
   writer ever takes a queue lock while holding a claim, so the two cannot deadlock: admission locks
   claims only with SKIP LOCKED;
2. the counts, read after the lock (READ COMMITTED: each statement sees every admission committed
   before it): runs admitted and not ended (a slot each, parked or not, until they end, as DBOS's
   dequeued workflows), those whose claim this engine holds (``per_engine``), the admissions inside the
   rate window, the concurrency keys in use;
3. the waiting runs in order (priority, then start time, then id), skipping keys in use;
4. their claims, locked in workflow_id order in one statement, SKIP LOCKED (``store.commit.fenced``,
   nested: the one entry point of workflow-scoped writes);
5. the runs still waiting among them (a cancel may have won their claim lock), their rows locked SKIP
   LOCKED (a row a user's open transaction holds is never waited for: that run waits for a later
   admission), made ``running``, their ``execution_deadline`` set from their start's
   ``execution_timeout`` (it counts from admission); runs passed over in 4-5 leave their slots to the
   next in order: 3 again past them (``ROUNDS`` times at most), so a held head does not keep the runs
   behind it waiting (ADR 0011);
6. their claims held by this engine (``store.claims.hold_admitted``).

A frozen engine's admitted runs keep their slots until they end (after a takeover); a frozen engine
inside step 2-6 holds the queue lock until PostgreSQL ends its idle transaction (the engine's sessions
are bounded, engine/sessions.py), which rolls its admission back: it never commits counts that others
could have changed. Meanwhile the other engines skip the queue (they do not wait for its lock), so
nobody admits from it until then, and nothing else stalls.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Case, Count, DurationField, F, Max, Min, Q, Subquery, Value, When
from django.db.models.functions import Greatest, Least

from ..durations import MAX_DURATION
from ..flow import QueueConfig
from ..models import Engine, Workflow, WorkflowClaim
from ..status import ACTIVE_STATUSES, WorkflowStatus
from . import claims
from .backend import backend
from .clock import db_clock, db_now
from .commit import fenced
from .liveness import live
from .moments import Readable, StoredText

QUEUE_LOCKS = 0x77656671  # the advisory-lock namespace of queue admissions ("wefq")
PAGE = 200  # waiting runs read per round while keys in use are skipped
MAX_PAGES = 25  # at most PAGE * MAX_PAGES waiting runs looked at per admission
ROUNDS = 4  # choices per admission: after runs passed over (held elsewhere), the next in order, this often


def _active(queue: str, using: str) -> Any:
    return Workflow.objects.using(using).filter(queue=queue, admitted_at__isnull=False, status__in=ACTIVE_STATUSES)


def admit(
    engine_id: str,
    queue: QueueConfig,
    *,
    limit: int,
    ttl: timedelta,
    using: str,
) -> dict[str, int]:
    """Admit up to ``limit`` waiting runs of ``queue`` within its limits, claimed by ``engine_id``.

    Args:
        engine_id: the admitting engine (the new holder).
        queue: the queue's configuration.
        limit: at most this many this time (the engine's claim batch).
        ttl: the claims' time to live.
        using: the connection alias.

    Returns:
        {workflow_id: epoch} of the runs admitted (held by ``engine_id``).

    Raises:
        django.db.DatabaseError: a statement failed (nothing admitted). A queue whose lock another
            transaction holds is not an error: nothing is admitted this time ({}).
    """
    if limit <= 0:
        return {}
    with transaction.atomic(using=using):
        if not backend(using).try_lock_name(QUEUE_LOCKS, queue.name):
            return {}  # another transaction admits from this queue (or is stopped inside it): next pass
        now = db_now(using)
        free = _free_slots(engine_id, queue, limit, now, using)
        admitted: dict[str, int] = {}
        passed: set[str] = set()  # chosen, not admitted: held elsewhere (a user's open transaction) or ended
        for _ in range(ROUNDS):
            chosen = _choose(queue.name, free - len(admitted), using, passed=passed) if free > len(admitted) else []
            if not chosen:
                break
            held = _admit_chosen(engine_id, queue.name, chosen, now, ttl, using)
            if held is None:  # a claim held elsewhere (never expected): admit none of it
                transaction.set_rollback(True, using=using)
                return {}
            admitted.update(held)
            if len(held) == len(chosen):
                break
            # Some were passed over: the next in order take their places (a held head kept every run behind
            # it waiting while the queue had room); they are admitted on a later pass, once free.
            passed.update(wid for wid in chosen if wid not in held)
        return admitted


def _admit_chosen(
    engine_id: str, queue: str, chosen: list[str], now: datetime, ttl: timedelta, using: str
) -> dict[str, int] | None:
    """Steps 4-6 for the ``chosen`` runs: those whose claim and row are free and still waiting made
    running and held by ``engine_id``. Returns {workflow_id: epoch} of those admitted ({} for none), or
    None when a claim turned out held elsewhere (the caller rolls the admission back)."""
    # The one entry point of workflow-scoped writes: the claims locked first, in one statement in
    # workflow_id order, skipping rows another transaction holds (nested: a savepoint of this one).
    with fenced(chosen, using, wait=False) as fence:
        # ``limit`` is CLAIM_BATCH_SIZE: its ids go in chunks past the database's parameter limit.
        runs, found = Workflow.objects.using(using), backend(using)
        unadmitted = runs.filter(status=WorkflowStatus.PENDING, admitted_at__isnull=True, queue=queue)
        # Their rows too, SKIP LOCKED: a run whose row a user's open transaction holds waits for a later
        # admission (the UPDATE below waited for it, on the engine's loop, then failed the admission).
        if found.skips_locked:
            unadmitted = unadmitted.select_for_update(skip_locked=True, no_key=True).order_by("id")
        timeouts = {
            wid: timeout
            for chunk in found.chunks(sorted(fence.held))
            for wid, timeout in unadmitted.filter(id__in=chunk).values_list("id", _BOUNDED_TIMEOUT)
        }
        waiting = sorted(timeouts)
        if not waiting:
            return {}
        for chunk in found.chunks(waiting):
            runs.filter(id__in=chunk).update(
                status=WorkflowStatus.RUNNING, admitted_at=now, started_at=now, updated_at=now
            )
        _set_deadlines(timeouts, now, using)
        held = claims.hold_admitted(engine_id, waiting, ttl, using)
        return held if len(held) == len(waiting) else None


# The start's execution_timeout, bounded in SQL to what a start accepts (0 to MAX_DURATION): PostgreSQL's
# interval goes past a timedelta (over 999999999 days), and a damaged row's read raised DataError in
# every admission, so that run, first in its queue, kept every other run of the queue waiting for ever.
_BOUNDED_TIMEOUT = Case(
    When(execution_timeout__isnull=True, then=Value(None, output_field=DurationField())),
    default=Least(
        Greatest(F("execution_timeout"), Value(timedelta(0), output_field=DurationField())),
        Value(MAX_DURATION, output_field=DurationField()),
    ),
    output_field=DurationField(),
)


def _set_deadlines(timeouts: dict[str, timedelta | None], now: datetime, using: str) -> None:
    """The admitted runs' execution deadlines: their start's execution_timeout counts from admission.
    A stored timeout outside what a start accepts (a damaged row) counts as the nearest bound, 0 or
    MAX_DURATION: added as it was, it left the range of a date (OverflowError, no DatabaseError), and
    every pass of the engine failed, stopping every other run."""
    by_timeout: dict[timedelta, list[str]] = {}
    for wid, timeout in timeouts.items():
        if timeout is not None:
            by_timeout.setdefault(max(timedelta(0), min(timeout, MAX_DURATION)), []).append(wid)
    for timeout, ids in by_timeout.items():
        for chunk in backend(using).chunks(ids):
            Workflow.objects.using(using).filter(id__in=chunk).update(execution_deadline=now + timeout)


def enter_queue(workflow_id: str, queue: str, priority: int, concurrency_key: str | None, using: str) -> bool:
    """A pending run waiting outside any queue (a schedule's overlap="queue" occurrence, released) enters
    ``queue`` with ``priority`` and ``concurrency_key``, to wait for its admission like a new start; its
    claim locked first (SKIP LOCKED: never waits), then no longer runnable until admitted. In the
    caller's transaction. Returns whether it entered (False: its claim or its row was locked elsewhere,
    try again next pass, or a cancel ended it)."""
    with fenced([workflow_id], using, wait=False) as fence:
        if workflow_id not in fence.held:
            return False
        waiting = Workflow.objects.using(using).filter(
            pk=workflow_id, status=WorkflowStatus.PENDING, admitted_at__isnull=True
        )
        locked = waiting.select_for_update(skip_locked=True, no_key=True).values_list("pk", flat=True)
        if backend(using).skips_locked and not list(locked):
            return False  # ended, or its row is held elsewhere (a user's open transaction): next pass
        entered = waiting.update(
            queue=queue, priority=priority, concurrency_key=concurrency_key, execution_deadline=None
        )
        if entered:
            claims.rotate_epoch(workflow_id, using, runnable=False)
        return bool(entered)


def admissible(engine_id: str, queue: QueueConfig, using: str) -> bool:
    """Whether ``admit`` would let a run of ``queue`` in now (a plain read, no lock: a hint for idle checks)."""
    return _free_slots(engine_id, queue, 1, db_now(using), using) > 0 and bool(_choose(queue.name, 1, using))


def _free_slots(engine_id: str, queue: QueueConfig, limit: int, now: datetime, using: str) -> int:
    free = limit
    if queue.concurrency is not None:
        free = min(free, queue.concurrency - _active(queue.name, using).count())
    if queue.per_engine is not None and free > 0:
        mine = WorkflowClaim.objects.using(using).filter(engine_id=engine_id).values("workflow_id")
        free = min(free, queue.per_engine - _active(queue.name, using).filter(id__in=mine).count())
    if queue.rate is not None and free > 0:
        recent = Workflow.objects.using(using).filter(queue=queue.name, admitted_at__gt=now - queue.rate.period).count()
        free = min(free, queue.rate.limit - recent)
    return free


def _choose(queue: str, free: int, using: str, *, passed: set[str] | None = None) -> list[str]:
    """The next ``free`` waiting runs in order, at most one per concurrency key and none whose key an
    admitted, not ended run holds, none of ``passed``. Each page is read past the keys in use (or chosen
    already), in SQL: a long backlog of one busy key never fills the pages and starves the runs behind it."""
    held = _active(queue, using).filter(concurrency_key__isnull=False).values("concurrency_key")
    waiting = (
        Workflow.objects.using(using)
        .filter(queue=queue, status=WorkflowStatus.PENDING, admitted_at__isnull=True)
        .exclude(concurrency_key__in=held)
    )
    if passed:
        waiting = waiting.exclude(id__in=sorted(passed))
    chosen: list[str] = []
    taken: set[str] = set()  # keys chosen in this admission: a few (at most ``free``)
    after: tuple[int, str] | None = None
    for _ in range(MAX_PAGES):
        page = waiting.exclude(concurrency_key__in=sorted(taken)) if taken else waiting
        if after is not None:
            # Past the last row read: its start time compared in SQL, never read into Python (a damaged
            # one, before year 1 say, is no datetime: reading it failed every admission of the queue).
            priority, wid = after
            created = Workflow.objects.using(using).filter(pk=wid).values("created_at")[:1]
            page = page.filter(
                Q(priority__gt=priority)
                | Q(priority=priority, created_at__gt=Subquery(created))
                | Q(priority=priority, created_at=Subquery(created), id__gt=wid)
            )
        rows = list(
            page.order_by("priority", "created_at", "id").values_list("id", "priority", "concurrency_key")[:PAGE]
        )
        for wid, _priority, key in rows:
            if key is not None:
                if key in taken:
                    continue
                taken.add(key)
            chosen.append(wid)
            if len(chosen) >= free:
                return chosen
        if len(rows) < PAGE:
            return chosen
        after = (rows[-1][1], rows[-1][0])
    return chosen


# -- reading (admin, CLI, doctor) ---------------------------------------------------------------


def queue_stats(
    names: Iterable[str], using: str, *, now: datetime | None = None, windows: dict[str, timedelta]
) -> list[dict[str, Any]]:
    """Per queue: waiting, running (admitted, not ended), admitted in its rate window (``windows``),
    the oldest waiting start, the last admission and the concurrency keys in use; "unreadable" (only
    then) names the oldest start or last admission a hand edit made a time Python cannot represent
    (read as None), with its stored text.

    Args:
        names: the queues; ``using``: the connection alias; ``now``: workflow time (default now).
        windows: each rate-limited queue's window.
    """
    when = now if now is not None else db_now(using)
    found = []
    for name in names:
        # The oldest start and the last admission through store.moments: a damaged one (a hand edit
        # Python cannot represent) is None, named under "unreadable", instead of failing the report.
        waiting = (
            Workflow.objects.using(using)
            .filter(queue=name, status=WorkflowStatus.PENDING, admitted_at__isnull=True)
            .aggregate(n=Count("pk"), oldest=Readable(Min("created_at")), oldest_text=StoredText(Min("created_at")))
        )
        running = _active(name, using)
        keys = list(
            running.filter(concurrency_key__isnull=False)
            .values("concurrency_key")
            .annotate(n=Count("pk"))
            .order_by("concurrency_key")
            .values_list("concurrency_key", "n")[:50]
        )
        window = windows.get(name)
        recent = (
            Workflow.objects.using(using).filter(queue=name, admitted_at__gt=when - window).count()
            if window is not None
            else None
        )
        latest = (
            Workflow.objects.using(using)
            .filter(queue=name)
            .aggregate(last=Readable(Max("admitted_at")), last_text=StoredText(Max("admitted_at")))
        )
        stats = {
            "queue": name,
            "waiting": int(waiting["n"]),
            "oldest_waiting": waiting["oldest"],
            "running": running.count(),
            "in_window": recent,
            "last_admitted": latest["last"],
            "keys": keys,
        }
        unreadable = {"oldest_waiting": waiting["oldest_text"], "last_admitted": latest["last_text"]}
        if any(unreadable.values()):
            stats["unreadable"] = {key: text for key, text in unreadable.items() if text is not None}
        found.append(stats)
    return found


def queues_in_use(using: str) -> list[str]:
    """The queue names that runs name (waiting or admitted and not ended)."""
    rows = (
        Workflow.objects.using(using)
        .filter(queue__isnull=False, status__in=ACTIVE_STATUSES)
        .values_list("queue", flat=True)
        .distinct()
    )
    return sorted({str(name) for name in rows})


def served_queues(*, within: timedelta, using: str) -> dict[str, list[str] | None]:
    """Live engines (a heartbeat within ``within`` of the database clock, either side: store/liveness.py;
    not stopped) and the queues each serves (None: all)."""
    rows = Engine.objects.using(using).filter(live(db_clock(using), within), stopped_at__isnull=True)
    return {engine_id: queues for engine_id, queues in rows.values_list("id", "queues")}
