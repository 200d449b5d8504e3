"""When a held claim has lapsed, as the readers (admin, ``weft`` command, doctor) show it: the takeover
rule of ``holding.py`` in ORM form, read-only.

A held claim has lapsed when its expiry is past, or, renewed as dormant (its expiry more than the claim
TTL ahead), when its holder's heartbeat is no evidence of life (more than the claim TTL old, the expiry
a claim renewed at that heartbeat would have had, or as far ahead: ``store/liveness.py``) or its holder
has no engine row at all (a hand edit: nothing would ever
free a claim of expiry 'infinity'): an engine renews the claims of its evicted workflows only once per
nine TTLs (ADR 0014), so a dead engine's dormant claims expire late and only its heartbeat shows that
they are orphaned. A claim renewed with the TTL is kept by its expiry alone: a live engine whose heartbeat
is skipped behind a locked engine row keeps renewing it (and its dormant claims with the TTL meanwhile).
Another engine takes a lapsed claim over once the takeover grace (``TAKEOVER_GRACE_MULTIPLIER`` renew
intervals) has passed as well.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q, Subquery

from ...models import Engine
from ..liveness import is_live, silent

TAKEOVER_GRACE_MULTIPLIER = 2


def takeover_grace(renew_interval: timedelta) -> timedelta:
    """How long after it lapsed a claim may be taken over: ``TAKEOVER_GRACE_MULTIPLIER`` renew intervals."""
    return renew_interval * TAKEOVER_GRACE_MULTIPLIER


def holder_heartbeat(using: str, *, engine: str = "engine_id") -> Subquery:
    """An expression for querysets of claims (or of rows annotated with their holder): the last
    heartbeat of the holder named by the field ``engine`` (None: no such engine row).

    Args:
        using: the connection alias.
        engine: the field or annotation that names the holder.
    """
    return Subquery(Engine.objects.using(using).filter(pk=OuterRef(engine)).values("heartbeat_at")[:1])


def holder_silent(using: str, now: datetime, within: timedelta, *, engine: str = "engine_id") -> Exists:
    """An expression for querysets of claims (or of rows annotated with their holder): whether the
    holder named by the field ``engine`` has an engine row whose heartbeat is no evidence of life (more
    than ``within`` from ``now``, either side: ``store/liveness.py``).

    Args:
        using: the connection alias.
        now: the database clock's reading.
        within: the tolerance (the claim TTL, plus any grace).
        engine: the field or annotation that names the holder.
    """
    return Exists(Engine.objects.using(using).filter(silent(now, within), pk=OuterRef(engine)))


def holder_registered(using: str, *, engine: str = "engine_id") -> Exists:
    """An expression for querysets of claims (or of rows annotated with their holder): whether the
    holder named by the field ``engine`` has an engine row."""
    return Exists(Engine.objects.using(using).filter(pk=OuterRef(engine)))


def lapsed(
    using: str,
    now: datetime,
    ttl: timedelta,
    grace: timedelta = timedelta(0),
    *,
    expires: str = "expires_at",
    engine: str = "engine_id",
) -> Q:
    """A filter of held claims that have lapsed ``grace`` ago or more (see the module docstring).

    Args:
        using: the connection alias.
        now: the database clock's reading.
        ttl: WEFT["WORKFLOW_CLAIM_TTL"].
        grace: how long past the lapse (0: lapsed at all; the takeover grace: due for takeover).
        expires, engine: the fields (or annotations) of the claim's expiry and holder.
    """
    gone = Q(holder_silent(using, now, ttl + grace, engine=engine)) | ~Q(holder_registered(using, engine=engine))
    return Q(**{f"{engine}__isnull": False}) & (
        Q(**{f"{expires}__lt": now - grace}) | (Q(**{f"{expires}__gt": now + ttl}) & gone)
    )


def has_lapsed(expires_at: datetime | None, heartbeat_at: datetime | None, now: datetime, ttl: timedelta) -> bool:
    """The same rule for one held claim already read, with its holder's heartbeat (None: no engine row,
    or a value Python cannot hold, so nothing keeps a dormant claim)."""
    expired = expires_at is not None and expires_at < now
    dormant = expires_at is not None and expires_at > now + ttl
    return expired or (dormant and not is_live(heartbeat_at, now, ttl))
