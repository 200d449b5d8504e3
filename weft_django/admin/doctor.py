"""The checks of ``manage.py weft doctor``: database, migrations, settings, the clock, live engines,
lapsed claims, overdue timers, dead engines, stuck workflows, active runs with no claim, queues no
engine serves. Errors make it exit 1
(a liveness probe); warnings are reported (and fail with ``--strict``). Read-only; nothing here imports
django.contrib.admin.

Claims and heartbeats are compared with the raw database clock, timers with workflow time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DataError, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Count, Exists, OuterRef

from ..models import Engine, Timer, Workflow, WorkflowClaim
from ..status import ACTIVE_STATUSES, WORKFLOW_SCOPED_TIMERS, WorkflowStatus
from ..store.backend import backend
from ..store.claims import TAKEOVER_GRACE_MULTIPLIER, holder_heartbeat, lapsed, takeover_grace
from ..store.liveness import live, silent
from ..store.moments import UNREADABLE, Readable, StoredText, readable_rows
from .formatting import format_duration, heartbeat_age

OK, WARNING, ERROR, SKIPPED = "ok", "warning", "error", "skipped"
OVERDUE_TIMER_SLACK = timedelta(minutes=1)
DETAIL_LIMIT = 10


@dataclass
class Finding:
    """One doctor check: ok, warning (reported, exit 0), error (exit 1) or skipped."""

    check: str
    level: str
    summary: str
    details: list[str] = field(default_factory=list)
    hint: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _database(using: str) -> Finding:
    try:
        store = backend(using)
        store.ping()
    except Exception as exc:
        return Finding(
            "database",
            ERROR,
            f'cannot reach the database "{using}": {exc}'.strip(),
            hint="Check DATABASES and that the server is up and accepts connections.",
        )
    return Finding("database", OK, f'database "{using}" ({store.display_name}) answers')


def _migrations(using: str) -> tuple[Finding, bool]:
    """The finding and whether weft's own tables are fully migrated."""
    executor = MigrationExecutor(connections[using or DEFAULT_DB_ALIAS])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if not plan:
        return Finding("migrations", OK, "every migration is applied"), True
    pending = [f"{migration.app_label}.{migration.name}" for migration, _ in plan]
    weft_ready = not any(name.startswith("weft_django.") for name in pending)
    return (
        Finding(
            "migrations",
            ERROR,
            f"{len(pending)} migration(s) not applied",
            pending[:DETAIL_LIMIT],
            "Run `python manage.py migrate`.",
        ),
        weft_ready,
    )


def _settings(using: str) -> Finding:
    from django.conf import settings

    from .. import conf
    from ..checks import sqlite_problems

    silenced = set(getattr(settings, "SILENCED_SYSTEM_CHECKS", ()))
    problems = [p for p in (*conf.problems(), *sqlite_problems(using)) if p.id not in silenced]
    if not problems:
        return Finding("settings", OK, "WEFT settings are valid")
    errors = [p for p in problems if ".E" in p.id]
    return Finding(
        "settings",
        ERROR if errors else WARNING,
        f"{len(problems)} settings problem(s)",
        [f"{p.id}: {p.message} HINT: {p.hint}" for p in problems],
        "Fix the WEFT setting; `python manage.py check` lists the same problems.",
    )


def _lapsed_claims(using: str, now: datetime, ttl: timedelta, renew: timedelta) -> Finding:
    """Claims past their takeover grace (expired, or their holder silent for longer than the TTL, more
    than the grace ago: store/claims/lapse.py) that nobody took over."""
    grace = takeover_grace(renew)
    found = WorkflowClaim.objects.using(using).filter(lapsed(using, now, ttl, grace))
    count = found.count()
    if not count:
        return Finding("lapsed claims", OK, "no claim is past its takeover grace")
    # a time a hand edit put out of Python's reach reads as None (store/moments.py): named with its stored text
    shown = found.annotate(
        holder_heartbeat=Readable(holder_heartbeat(using)), heartbeat_stored=StoredText(holder_heartbeat(using))
    )
    details = [
        f"{c.workflow_id} held by {c.engine_id} (epoch {c.epoch}) " + _lapse(c, now)
        for c in readable_rows(shown.order_by("expires_at", "workflow_id"))[:DETAIL_LIMIT]
    ]
    return Finding(
        "lapsed claims",
        ERROR,
        f"{count} claim(s) lapsed (expired, or their engine silent for longer than the claim TTL) more than "
        f"{TAKEOVER_GRACE_MULTIPLIER} renew intervals ago and nobody took them over",
        details,
        "Start an engine (`python manage.py weft_engine`): a live engine takes lapsed claims over.",
    )


def unreadable_text(stored: str) -> str:
    return f"{UNREADABLE} ({stored})"


def _lapse(claim: Any, now: datetime) -> str:
    """Why a lapsed claim (of ``_lapsed_claims``) lapsed, its unreadable times named with their stored text."""
    if "expires_at" in claim.weft_unreadable:
        return f"its expiry {unreadable_text(claim.weft_unreadable['expires_at'])}"
    if claim.expires_at < now:
        return f"expired {format_duration(now - claim.expires_at)} ago"
    if claim.heartbeat_stored is not None:
        return f"its engine's heartbeat {unreadable_text(claim.heartbeat_stored)}"
    if claim.holder_heartbeat is None:
        return "its engine has no engine row"
    if claim.holder_heartbeat > now:
        return f"its engine's heartbeat {heartbeat_age(now - claim.holder_heartbeat)}"
    return f"its engine silent for {format_duration(now - claim.holder_heartbeat)}"


def _overdue_timers(using: str, wf_now: datetime) -> Finding:
    held = WorkflowClaim.objects.using(using).filter(engine_id__isnull=False).values("workflow_id")
    overdue = Timer.objects.using(using).filter(
        kind__in=list(WORKFLOW_SCOPED_TIMERS), fire_at__lt=wf_now - OVERDUE_TIMER_SLACK, workflow_id__in=held
    )
    count = overdue.count()
    if not count:
        return Finding("overdue timers", OK, "no owned workflow has a timer overdue by more than a minute")
    details = [
        f"{t.workflow_id}: {t.kind} timer was due {format_duration(wf_now - t.fire_at)} ago"
        for t in overdue.order_by("fire_at")[:DETAIL_LIMIT]
    ]
    return Finding(
        "overdue timers",
        ERROR,
        f"{count} timer(s) of owned workflows are overdue by more than a minute",
        details,
        "Their owners are not firing timers: look for a stalled or overloaded engine (`weft engines`).",
    )


def _dead_engines(using: str, now: datetime, ttl: timedelta, renew: timedelta) -> Finding:
    """Engines that have not stopped and are silent for longer than the TTL (or whose heartbeat is further
    ahead than it: no evidence of life, store/liveness.py). One that claims still name is an error once
    it is silent past the takeover grace too (its claims should have been taken by then); before that it
    is being taken over, a warning: the "lapsed claims" check waits the same grace, and a liveness probe
    of the healthy engines must not fail while the system heals itself."""
    quiet = Engine.objects.using(using).filter(silent(now, ttl), stopped_at__isnull=True)
    # compared as stored, as the engines do; a time a hand edit put out of Python's reach is named, not read
    overdue_ids = set(quiet.filter(silent(now, ttl + takeover_grace(renew))).values_list("id", flat=True))
    dead = list(readable_rows(quiet.order_by("heartbeat_at")))
    if not dead:
        return Finding("dead engines", OK, "every engine that has not stopped is heartbeating")
    holding = dict(
        WorkflowClaim.objects.using(using)
        .filter(engine_id__in=[e.id for e in dead])
        .values("engine_id")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("engine_id", "n")
    )
    details = [
        f"{e.id} (host {e.host}, pid {e.pid}): last heartbeat "
        + (
            unreadable_text(e.weft_unreadable["heartbeat_at"])
            if e.heartbeat_at is None
            else heartbeat_age(now - e.heartbeat_at)
        )
        + f", holds {holding.get(e.id, 0)} claim(s)"
        for e in dead[:DETAIL_LIMIT]
    ]
    overdue = [e for e in dead if e.id in holding and e.id in overdue_ids]
    return Finding(
        "dead engines",
        ERROR if overdue else WARNING,
        f"{len(dead)} engine(s) stopped heartbeating without shutting down"
        + (f"; {sum(holding.values())} claim(s) still name them" if holding else "")
        + ("" if overdue or not holding else " (being taken over: within the takeover grace)"),
        details,
        "A dead engine's claims are taken over once they lapse; one that holds none is only history "
        "(its row stays until an engine with the same id starts again).",
    )


def _no_live_engine(using: str, now: datetime, ttl: timedelta, manual: bool) -> Finding:
    alive = Engine.objects.using(using).filter(live(now, ttl), stopped_at__isnull=True).exists()
    runnable = Workflow.objects.using(using).filter(status=WorkflowStatus.RUNNING).count()
    if alive or not runnable:
        return Finding("engines", OK, "an engine is alive" if alive else "no engine is alive, and nothing is running")
    return Finding(
        "engines",
        WARNING if manual else ERROR,
        f"{runnable} workflow(s) are running and no engine is alive",
        hint="Start `python manage.py weft_engine`"
        + (" (BACKGROUND_TASKS is manual: the host calls weft.run_maintenance())." if manual else "."),
    )


def _stuck(using: str) -> Finding:
    stuck = Workflow.objects.using(using).filter(stuck_error__isnull=False, status__in=list(ACTIVE_STATUSES))
    count = stuck.count()
    if not count:
        return Finding("stuck workflows", OK, "no workflow is stuck on a replay error")
    details = []
    for row in stuck.order_by("updated_at").values("id", "workflow_type", "stuck_error")[:DETAIL_LIMIT]:
        error = row["stuck_error"] if isinstance(row["stuck_error"], dict) else {}
        message = str(error.get("message", "")).splitlines()[0:1]
        details.append(f"{row['id']} ({row['workflow_type']}): {error.get('type', 'Error')}: {''.join(message)}")
    return Finding(
        "stuck workflows",
        WARNING,
        f"{count} workflow(s) are stuck (NonDeterminismError / VersionMismatchError); engines keep retrying",
        details,
        "Deploy code that matches their history (keep old workflow versions registered); restarting does not help.",
    )


def _unclaimed(using: str) -> Finding:
    """Active runs with no claim row: no engine acquires them (a row deleted by hand, an old version)."""
    has_claim = WorkflowClaim.objects.using(using).filter(workflow_id=OuterRef("pk"))
    unclaimed = Workflow.objects.using(using).filter(status__in=list(ACTIVE_STATUSES)).exclude(Exists(has_claim))
    ids = list(unclaimed.order_by("pk").values_list("pk", flat=True)[: DETAIL_LIMIT + 1])
    if not ids:
        return Finding("unclaimed runs", OK, "every active run has its claim row")
    return Finding(
        "unclaimed runs",
        ERROR,
        f"{unclaimed.count()} active run(s) have no claim row: no engine will run them",
        ids[:DETAIL_LIMIT],
        'Cancel them (weft cancel ID), or start them again with on_conflict="start_new" once cancelled; a claim '
        "row is only ever removed with its run, so look for a hand edit or a failed migration.",
    )


def _clock(using: str) -> tuple[Finding, datetime | None]:
    """Workflow time (the database clock plus the test kit's offset) and whether it can be read."""
    from ..store.clock import db_now

    try:
        return Finding("clock", OK, "workflow time is the database clock"), db_now(using)
    except (DataError, OverflowError) as exc:
        return Finding(
            "clock",
            ERROR,
            f"workflow time cannot be computed: {exc}",
            [],
            "The ClockOffset row (set only by weft_django.testing's clock) moves workflow time past year 9999: "
            "delete it (ClockOffset.objects.all().delete()); engines fail every pass until then.",
        ), None


def _unserved_queues(using: str, ttl: timedelta, configured: list[str]) -> Finding:
    """A queue (of WEFT["QUEUES"], or named by active runs) that no live engine admits from."""
    from ..store import queues

    named = set(queues.queues_in_use(using))
    if not configured and not named:
        return Finding("queues", OK, 'no queue is defined (WEFT["QUEUES"]) and no run names one')
    live = queues.served_queues(within=ttl, using=using)
    if not live:
        return Finding("queues", SKIPPED, "skipped: no engine is alive (see engines)")
    every = any(served is None for served in live.values())
    served = set(configured) if every else {name for names in live.values() for name in (names or [])}
    unserved = sorted((set(configured) | named) - served)
    if not unserved:
        return Finding("queues", OK, f"every queue is served ({len(configured)} configured)")
    stats = {row["queue"]: row for row in queues.queue_stats(unserved, using, windows={})}
    waiting = sum(int(stats[name]["waiting"]) for name in unserved)
    details = [
        f"{name}: {stats[name]['waiting']} waiting"
        + ("" if name in configured else ' (not in WEFT["QUEUES"]: no engine admits from it)')
        for name in unserved
    ]
    return Finding(
        "queues",
        ERROR if waiting else WARNING,
        f"{len(unserved)} queue(s) served by no live engine, {waiting} run(s) waiting in them",
        details[:DETAIL_LIMIT],
        "Start `python manage.py weft_engine --queues <name>` (or without --queues: every queue), and keep "
        'every queue that runs name in WEFT["QUEUES"].',
    )


def doctor(using: str) -> list[Finding]:
    """Every check, in order. Later checks are skipped when what they need is missing."""
    from ..conf import get_settings
    from ..exceptions import ConfigurationError
    from ..store.clock import db_clock

    findings = [_database(using)]
    if findings[0].level == ERROR:
        return [*findings, Finding("migrations", SKIPPED, "skipped: the database is unreachable")]
    migrations, weft_ready = _migrations(using)
    findings += [migrations, _settings(using)]
    if not weft_ready:
        findings.append(Finding("ownership", SKIPPED, "skipped: weft_django's tables are not migrated"))
        return findings
    try:
        settings = get_settings()
    except ConfigurationError:
        findings.append(Finding("ownership", SKIPPED, "skipped: the WEFT settings are invalid"))
        return findings
    now = db_clock(using)
    clock, wf_now = _clock(using)
    findings.append(clock)
    ttl, renew = settings.workflow_claim_ttl, settings.workflow_claim_renew_interval
    checks: list[Callable[[], Finding]] = [
        lambda: _no_live_engine(using, now, ttl, settings.background_tasks == "manual"),
        lambda: _lapsed_claims(using, now, ttl, renew),
        lambda: (
            _overdue_timers(using, wf_now)
            if wf_now is not None
            else Finding("overdue timers", SKIPPED, "skipped: workflow time cannot be computed (see clock)")
        ),
        lambda: _dead_engines(using, now, ttl, renew),
        lambda: _stuck(using),
        lambda: _unclaimed(using),
        lambda: _unserved_queues(using, ttl, sorted(settings.queues)),
    ]
    return findings + [check() for check in checks]


def healthy(findings: list[Finding], *, strict: bool = False) -> bool:
    failing = {ERROR, WARNING} if strict else {ERROR}
    return not any(finding.level in failing for finding in findings)
