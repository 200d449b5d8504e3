"""What operators look at: workflows with their claim, engines and their liveness, claims and their
expiry. Read-only queries, shared by the admin views and the ``weft`` command; nothing here imports
django.contrib.admin. Claims and heartbeats are compared with the raw database clock (``db_clock``),
as the engine does."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    BooleanField,
    CharField,
    Count,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Cast, Concat

from ..models import Engine, Step, Workflow, WorkflowClaim
from ..status import WorkflowStatus
from ..store import runs
from ..store.claims import has_lapsed, holder_heartbeat, holder_silent, lapsed
from ..store.liveness import silent as heartbeat_silent
from ..store.moments import Readable, StoredText, readable_rows

ALIVE, STOPPED, DEAD = "alive", "stopped", "dead"


def with_ownership(queryset: QuerySet[Workflow], using: str, *, timers: bool = False) -> QuerySet[Workflow]:
    """Annotate workflows with their claim (``owner_engine``, ``claim_epoch``, ``claim_expires_at``, and
    ``owner_heartbeat``: the holder's last heartbeat, for ``claim_lapsed``),
    their last recorded step (``last_step``, "#seq kind name") and, with ``timers``, their
    ``pending_timers`` count: correlated subqueries, so a page of rows stays one query.

    An expiry or heartbeat a hand edit put out of Python's reach (``store.moments``) reads as None, the
    expiry's stored text in ``claim_expires_unreadable`` (else None); filters and ordering use the expiry
    as stored, the alias ``claim_expiry_stored``."""
    claim = WorkflowClaim.objects.using(using).filter(pk=OuterRef("pk"))
    last_step = (
        Step.objects.using(using)
        .filter(run_id=OuterRef("run_id"))
        .order_by("-seq")
        .annotate(
            label=Concat(
                Value("#"), Cast("seq", CharField()), Value(" "), "kind", Value(" "), "name", output_field=CharField()
            )
        )
        .values("label")[:1]
    )
    queryset = (
        queryset.alias(claim_expiry_stored=Subquery(claim.values("expires_at")[:1]))
        .annotate(
            owner_engine=Subquery(claim.values("engine_id")[:1]),
            claim_epoch=Subquery(claim.values("epoch")[:1]),
            claim_expires_at=Readable(F("claim_expiry_stored")),
            claim_expires_unreadable=StoredText(F("claim_expiry_stored")),
            last_step=Subquery(last_step, output_field=CharField()),
        )
        .annotate(owner_heartbeat=Readable(holder_heartbeat(using, engine="owner_engine")))
    )
    if timers:
        queryset = queryset.annotate(pending_timers=runs.pending_timers(using))
    return queryset


def claim_lapsed(workflow: Workflow, now: datetime, ttl: timedelta) -> bool:
    """Whether a workflow annotated by ``with_ownership`` has a held claim that lapsed: expired, or its
    holder silent for longer than the TTL (store/claims/lapse.py)."""
    if getattr(workflow, "owner_engine", None) is None:
        return False
    return has_lapsed(getattr(workflow, "claim_expires_at", None), getattr(workflow, "owner_heartbeat", None), now, ttl)


def current_step(workflow: Workflow) -> str | None:
    """What describe() calls current_step: the recorded one, else the last step's label."""
    return workflow.current_step or (getattr(workflow, "last_step", None) or "").strip() or None


def readable_engines(queryset: QuerySet[Engine], now: datetime, ttl: timedelta) -> QuerySet[Engine]:
    """``queryset`` of engine rows for ``engine_state``: each annotated ``heartbeat_silent`` (its heartbeat,
    as stored, no evidence of life: older than ``ttl`` or further ahead than it, the engines' own rule,
    store/liveness.py), its timestamps read through ``store.moments`` (one a hand edit put out of
    Python's reach is None, named with its stored text in ``weft_unreadable``). Apply it last."""
    silent = ExpressionWrapper(heartbeat_silent(now, ttl), output_field=BooleanField())
    return readable_rows(queryset.annotate(heartbeat_silent=silent))


def engine_state(engine: Engine) -> str:
    """alive: heartbeat within the claim TTL of the database clock; stopped: shut down cleanly; dead:
    silent for longer than the TTL without stopping (killed, frozen, or cut off from the database), or a
    heartbeat further ahead than the TTL (a hand edit: no engine writes one, store/liveness.py).
    ``engine`` comes from ``readable_engines``: a heartbeat Python cannot hold has the state the engines
    give it ('infinity', '-infinity': dead, as ``other_live_engines`` counts them)."""
    if engine.stopped_at is not None or "stopped_at" in engine.weft_unreadable:  # type: ignore[attr-defined]
        return STOPPED
    return DEAD if engine.heartbeat_silent else ALIVE  # type: ignore[attr-defined]


@dataclass(frozen=True)
class EngineRow:
    engine: Engine
    state: str
    heartbeat_age: timedelta | None  # None: a heartbeat Python cannot hold (``unreadable``)
    claims_held: int
    claims_lapsed: int

    def as_dict(self) -> dict[str, Any]:
        e = self.engine
        return {
            "id": e.id,
            "host": e.host,
            "pid": e.pid,
            "mode": e.mode,
            "state": self.state,
            "started_at": e.started_at,
            "heartbeat_at": e.heartbeat_at,
            "heartbeat_age_seconds": None
            if self.heartbeat_age is None
            else round(self.heartbeat_age.total_seconds(), 3),
            "stopped_at": e.stopped_at,
            "claims_held": self.claims_held,
            "claims_lapsed": self.claims_lapsed,
            **({"unreadable": dict(self.unreadable)} if self.unreadable else {}),
        }

    @property
    def unreadable(self) -> dict[str, str]:
        """The engine row's timestamps Python cannot hold: {column: stored text}."""
        return dict(self.engine.weft_unreadable)  # type: ignore[attr-defined]


def engine_rows(using: str, now: datetime, ttl: timedelta) -> list[EngineRow]:
    """Every registered engine, live ones first, with how many claims each holds (two queries)."""
    held: dict[str | None, dict[str, Any]] = {
        row["engine_id"]: dict(row)
        for row in WorkflowClaim.objects.using(using)
        .filter(engine_id__isnull=False)
        .values("engine_id")
        .annotate(
            n=Count("pk"),
            lapsed=Count("pk", filter=Q(expires_at__lt=now)),
            dormant=Count("pk", filter=Q(expires_at__gt=now + ttl)),
        )
        .order_by()
    }
    rows = []
    # a timestamp a hand edit put out of Python's reach reads as None, shown marked (store/moments.py)
    for engine in readable_engines(Engine.objects.using(using).order_by("-heartbeat_at"), now, ttl):
        counts = held.get(engine.id, {})
        silent = engine.heartbeat_silent  # type: ignore[attr-defined]  # its dormant claims have lapsed too (lapse.py)
        rows.append(
            EngineRow(
                engine,
                engine_state(engine),
                None if engine.heartbeat_at is None else now - engine.heartbeat_at,
                counts.get("n", 0),
                counts.get("lapsed", 0) + (counts.get("dormant", 0) if silent else 0),
            )
        )
    order = {ALIVE: 0, DEAD: 1, STOPPED: 2}
    rows.sort(key=lambda row: order[row.state])
    return rows


@dataclass(frozen=True)
class ClaimRow:
    workflow_id: str
    workflow_type: str | None
    status: str | None
    engine_id: str | None
    epoch: int
    claimed_at: datetime | None
    expires_at: datetime | None
    expires_in: timedelta | None
    lapsed: bool
    unreadable: dict[str, str]  # the claim's timestamps Python cannot hold: {column: stored text}

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["expires_in_seconds"] = None if self.expires_in is None else round(self.expires_in.total_seconds(), 3)
        del data["expires_in"]
        if not self.unreadable:
            del data["unreadable"]
        return data


def claim_rows(
    using: str, now: datetime, ttl: timedelta, *, held_only: bool = True, limit: int | None = 200
) -> list[ClaimRow]:
    """Claims (held ones by default): those of silent engines first, then soonest expiry first, with
    their workflow's type and status and whether they lapsed (expired, or their holder silent for
    longer than ``ttl``), decided on the times as stored, as the engines do: a claim's or its holder's
    time a hand edit put out of Python's reach is None, named in the row's ``unreadable``."""
    workflow = Workflow.objects.using(using).filter(pk=OuterRef("pk"))
    claims = WorkflowClaim.objects.using(using).annotate(
        workflow_type=Subquery(workflow.values("workflow_type")[:1]),
        status=Subquery(workflow.values("status")[:1]),
        lapsed_now=ExpressionWrapper(lapsed(using, now, ttl), output_field=BooleanField()),
    )
    if held_only:
        claims = claims.filter(engine_id__isnull=False)
    # Soonest expiry first, after the claims of silent engines (dormant ones expire ten TTLs out, and
    # would fall past the limit while the summary counts them as lapsed).
    claims = readable_rows(
        claims.annotate(silent=holder_silent(using, now, ttl)).order_by("-silent", "expires_at", "workflow_id")
    )
    if limit is not None:
        claims = claims[:limit]
    rows = []
    for claim in claims:
        expires_in = None if claim.expires_at is None else claim.expires_at - now
        rows.append(
            ClaimRow(
                claim.workflow_id,
                claim.workflow_type,
                claim.status,
                claim.engine_id,
                claim.epoch,
                claim.claimed_at,
                claim.expires_at,
                expires_in,
                bool(claim.lapsed_now),
                dict(claim.weft_unreadable),  # type: ignore[attr-defined]
            )
        )
    return rows


@dataclass(frozen=True)
class OwnershipSummary:
    held: int
    lapsed: int
    running_unowned: int
    engines_alive: int
    engines_dead: int


def ownership_summary(using: str, now: datetime, ttl: timedelta, engines: list[EngineRow]) -> OwnershipSummary:
    counts = WorkflowClaim.objects.using(using).aggregate(
        held=Count("pk", filter=Q(engine_id__isnull=False)),
        lapsed=Count("pk", filter=lapsed(using, now, ttl)),
    )
    held_ids = WorkflowClaim.objects.using(using).filter(engine_id__isnull=False).values("workflow_id")
    running_unowned = (
        Workflow.objects.using(using).filter(status=WorkflowStatus.RUNNING).exclude(pk__in=held_ids).count()
    )
    return OwnershipSummary(
        held=counts["held"],
        lapsed=counts["lapsed"],
        running_unowned=running_unowned,
        engines_alive=sum(1 for row in engines if row.state == ALIVE),
        engines_dead=sum(1 for row in engines if row.state == DEAD),
    )
