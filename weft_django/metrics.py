"""Prometheus metrics (the optional ``prometheus`` extra: ``pip install 'weft-django[prometheus]'``).

Without ``prometheus-client`` this module still imports: ``AVAILABLE`` is False, every recording
function is a no-op and ``serve()`` / ``exposition()`` raise ConfigurationError saying what to install.

Metrics live in prometheus_client's default registry, so a project that already exposes it gets them
too. Families:

- ``weft_workflows{status,workflow_type}``: runs in the database by status, counted when scraped
  (one GROUP BY, cached for ``STATUS_CACHE_SECONDS``). Every process that exposes metrics reports the
  same numbers: aggregate with ``max``, not ``sum``.
- ``weft_step_duration_seconds{kind}``: settled steps, from start (or the wait's start) to settlement,
  observed by the engine that committed them.
- ``weft_activity_attempt_duration_seconds{activity,outcome}``: one activity attempt on the engine's
  threads (outcome ok | error | refused).
- ``weft_steps_committed_total{kind,status}``: settled steps committed by this process's engine.
- ``weft_workflows_finished_total{status}``: runs this process ended (engine commits and transitions).
- ``weft_workflows_started_total``: runs this process started.
- ``weft_claims_total{outcome}``: acquired | takeover | lost_race | deposed | released.
- ``weft_claim_renewal_failures_total``: renewal passes that failed with a database error.
- ``weft_fenced_commits_refused_total{reason}``: workflows whose writes the fence refused
  (deposed | released | missing | atomic).
- ``weft_engine_claims_held``, ``weft_engine_activities_running``: per live engine in this process
  (label ``engine``).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from .exceptions import ConfigurationError

logger = logging.getLogger(__name__)

try:
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError:  # the optional extra is not installed: metrics are no-ops
    prometheus_client = None  # type: ignore[assignment]
    AVAILABLE = False
else:
    AVAILABLE = True

INSTALL_HINT = (
    "Prometheus metrics need the optional dependency prometheus-client: "
    "pip install 'weft-django[prometheus]' (or pip install prometheus-client)."
)
STATUS_CACHE_SECONDS = 5.0
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 86400)

# Engines of this process whose gauges are reported (weak: a stopped engine disappears).
_engines: weakref.WeakSet[Any] = weakref.WeakSet()

if AVAILABLE:
    STEP_DURATION = prometheus_client.Histogram(
        "weft_step_duration_seconds", "Settled workflow steps, start to settlement.", ["kind"], buckets=DURATION_BUCKETS
    )
    ACTIVITY_DURATION = prometheus_client.Histogram(
        "weft_activity_attempt_duration_seconds",
        "Activity attempts run on this process's engine threads.",
        ["activity", "outcome"],
        buckets=DURATION_BUCKETS,
    )
    STEPS_COMMITTED = prometheus_client.Counter(
        "weft_steps_committed", "Settled steps committed by this process's engines.", ["kind", "status"]
    )
    WORKFLOWS_FINISHED = prometheus_client.Counter(
        "weft_workflows_finished", "Runs this process ended, by terminal status.", ["status"]
    )
    WORKFLOWS_STARTED = prometheus_client.Counter("weft_workflows_started", "Runs this process started.")
    CLAIMS = prometheus_client.Counter("weft_claims", "Claim outcomes of this process's engines.", ["outcome"])
    RENEWAL_FAILURES = prometheus_client.Counter(
        "weft_claim_renewal_failures", "Claim renewal passes that failed with a database error."
    )
    COMMITS_REFUSED = prometheus_client.Counter(
        "weft_fenced_commits_refused", "Workflows whose writes the fence refused.", ["reason"]
    )


# labels() takes a lock and validates on every call; the engine records per step, so the labelled
# children are cached here (label values are bounded: step kinds, statuses, activity names).
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    key = (metric, *labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def step_settled(kind: str, status: str, seconds: float | None) -> None:
    if not AVAILABLE:
        return
    _child(STEPS_COMMITTED, kind, status).inc()
    if seconds is not None:
        _child(STEP_DURATION, kind).observe(max(seconds, 0.0))


def activity_attempt(activity: str, outcome: str, seconds: float) -> None:
    if AVAILABLE:
        _child(ACTIVITY_DURATION, activity, outcome).observe(seconds)


def workflow_finished(status: str) -> None:
    if AVAILABLE:
        _child(WORKFLOWS_FINISHED, status).inc()


def workflow_started() -> None:
    if AVAILABLE:
        WORKFLOWS_STARTED.inc()


def claims(outcome: str, count: int = 1) -> None:
    if AVAILABLE and count:
        _child(CLAIMS, outcome).inc(count)


def renewal_failed() -> None:
    if AVAILABLE:
        RENEWAL_FAILURES.inc()


def commit_refused(reason: str) -> None:
    if AVAILABLE:
        _child(COMMITS_REFUSED, reason).inc()


def track_engine(engine: Any) -> None:
    _engines.add(engine)


# -- collectors (queried at scrape time) -------------------------------------------------------------
class _StatusCollector:
    """``weft_workflows{status,workflow_type}``: one GROUP BY per scrape, cached for a few seconds so
    several scrapers (or a short scrape interval) cost one query."""

    _lock = threading.Lock()
    _cached: tuple[float, list[tuple[str, str, int]]] | None = None  # shared by every instance

    @classmethod
    def cache_clear(cls) -> None:
        """Forget the cached counts (tests; the next scrape queries again)."""
        with cls._lock:
            cls._cached = None

    def _counts(self) -> list[tuple[str, str, int]]:
        from django.db import connections
        from django.db.models import Count

        from .conf import database_alias
        from .models import Workflow

        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < STATUS_CACHE_SECONDS:
                return self._cached[1]
            alias = database_alias()
            try:
                rows = [
                    (row["status"], row["workflow_type"], row["n"])
                    for row in Workflow.objects.using(alias)
                    .values("status", "workflow_type")
                    .annotate(n=Count("id"))
                    .order_by()
                ]
            finally:
                # On prometheus_client's server threads the connection must not outlive the scrape;
                # in a Django view (or a direct collect on the main thread) its owner closes it.
                if not getattr(_scope, "in_view", False) and threading.current_thread() is not threading.main_thread():
                    connections[alias].close()
            type(self)._cached = (time.monotonic(), rows)
            return rows

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(
            "weft_workflows", "Workflow runs in the database by status and type.", labels=["status", "workflow_type"]
        )
        try:
            counts = self._counts()
        except Exception:  # a scrape must not fail because the database is briefly away
            logger.exception("weft_workflows: could not count workflows")
            counts = []
        for status, workflow_type, count in counts:
            family.add_metric([status, workflow_type], count)
        yield family

    def describe(self) -> list[Any]:
        return []  # no query at registration time


class _EngineCollector:
    """Per-engine gauges read from the live engines of this process."""

    def collect(self) -> Iterator[Any]:
        held = GaugeMetricFamily("weft_engine_claims_held", "Workflows this engine drives.", labels=["engine"])
        running = GaugeMetricFamily(
            "weft_engine_activities_running", "Activity attempts running on this engine.", labels=["engine"]
        )
        for engine in list(_engines):
            held.add_metric([engine.engine_id], len(engine.owned))
            running.add_metric([engine.engine_id], len(engine.executor.running))
        yield held
        yield running

    def describe(self) -> list[Any]:
        return []


_scope = threading.local()
_registered = False
_register_lock = threading.Lock()


def enable() -> None:
    """Register the scrape-time collectors in the default registry (idempotent)."""
    global _registered
    if not AVAILABLE:
        raise ConfigurationError(INSTALL_HINT)
    with _register_lock:
        if _registered:
            return
        collectors: list[Collector] = [_StatusCollector(), _EngineCollector()]
        for collector in collectors:
            prometheus_client.REGISTRY.register(collector)
        _registered = True


def serve(port: int, addr: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` over HTTP on a daemon thread (prometheus_client's server); returns the port
    (useful with port 0, which picks a free one)."""
    enable()
    result = prometheus_client.start_http_server(port, addr=addr)
    if isinstance(result, tuple):  # prometheus-client >= 0.17 returns (server, thread)
        return int(result[0].server_address[1])
    return port


def exposition(accept: str | None = None) -> tuple[bytes, str]:
    """The text exposition of the default registry and its content type (for a Django view)."""
    enable()
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(accept or "")
    _scope.in_view = True
    try:
        return encoder(prometheus_client.REGISTRY), content_type
    finally:
        _scope.in_view = False
