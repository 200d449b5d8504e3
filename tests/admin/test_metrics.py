"""Prometheus metrics: recorded in process, served by a view and by ``weft_engine --metrics-port``, and
an engine that works without prometheus-client installed."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import RequestFactory

import weft_django as weft
from weft_django import metrics, views
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
prometheus_client = pytest.importorskip("prometheus_client")


def _value(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


def test_engine_records_claims_steps_and_attempts(weft_run_until_idle):
    acquired = _value("weft_claims_total", outcome="acquired")
    released = _value("weft_claims_total", outcome="released")
    steps = _value("weft_steps_committed_total", kind="activity", status="completed")
    durations = _value("weft_step_duration_seconds_count", kind="activity")
    attempts = _value(
        "weft_activity_attempt_duration_seconds_count", activity="tests.testapp.workflows.add", outcome="ok"
    )
    failed = _value("weft_workflows_finished_total", status="failed")
    weft.start("tests.sum", args=[1, 2], id="metrics-sum")
    weft.start("tests.fails", id="metrics-fails")
    weft_run_until_idle()
    assert _value("weft_claims_total", outcome="acquired") == acquired + 2
    assert _value("weft_claims_total", outcome="released") == released + 2  # by their terminal commits
    assert _value("weft_steps_committed_total", kind="activity", status="completed") == steps + 2
    assert _value("weft_step_duration_seconds_count", kind="activity") == durations + 2
    assert _value("weft_workflows_finished_total", status="failed") == failed + 1
    names = {
        sample.labels.get("activity")
        for family in prometheus_client.REGISTRY.collect()
        if family.name == "weft_activity_attempt_duration_seconds"
        for sample in family.samples
    }
    activity = next(name for name in names if name and name.endswith("add"))
    assert _value("weft_activity_attempt_duration_seconds_count", activity=activity, outcome="ok") >= attempts + 2


def test_the_view_counts_workflows_by_status(weft_run_until_idle):
    weft.start("tests.sum", args=[1, 2], id="metrics-view-1")
    weft.start("tests.signals", id="metrics-view-2")
    weft_run_until_idle()
    metrics._StatusCollector.cache_clear()
    response = views.metrics(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    text = response.content.decode()
    assert 'weft_workflows{status="completed",workflow_type="tests.sum"} 1.0' in text
    assert 'weft_workflows{status="running",workflow_type="tests.signals"} 1.0' in text
    assert "weft_claims_total" in text


def test_the_view_says_what_to_install_without_prometheus_client(monkeypatch):
    monkeypatch.setattr(metrics, "AVAILABLE", False)
    response = views.metrics(RequestFactory().get("/metrics"))
    assert response.status_code == 501 and b"pip install" in response.content


@pytest.mark.subprocess
def test_weft_engine_serves_metrics_over_http(weft_engines):
    engine = weft_engines("metrics-1", "--metrics-port", "0", "--metrics-addr", "127.0.0.1")
    url = wait_for(
        lambda: (m := re.search(r"metrics\s+(http://\S+)", engine.output())) and m.group(1),
        timeout=30,
        message="the banner's metrics URL",
    )
    handle = weft.start("tests.sum", args=[2, 2], id="metrics-http")
    assert handle.result(timeout=30) == {"total": 4}

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    text = wait_for(
        lambda: (body := scrape()) and 'weft_claims_total{outcome="released"}' in body and body,
        timeout=15,
        message="claim metrics",
    )
    assert re.search(r'weft_claims_total\{outcome="acquired"\} [1-9]', text), text
    assert 'weft_engine_claims_held{engine="metrics-1"}' in text
    assert re.search(r'weft_workflows\{status="completed",workflow_type="tests.sum"\} 1\.0', text), text
    assert 'weft_step_duration_seconds_bucket{kind="activity"' in text
    assert engine.stop() == 0


def _engine_without_prometheus(*engine_args: str) -> subprocess.CompletedProcess[str]:
    """A weft_engine subprocess in which ``import prometheus_client`` fails."""
    name = str(connection.settings_dict["NAME"])
    code = (
        "import sys; sys.modules['prometheus_client'] = None; "
        f"sys.argv = ['weft', '--database-name', {name!r}, '--', *{list(engine_args)!r}]; "
        "from weft_django.testing import _main; _main()"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.subprocess
def test_the_engine_runs_without_prometheus_client():
    handle = weft.start("tests.sum", args=[3, 4], id="metrics-absent")
    done = _engine_without_prometheus("--engine-id", "no-prometheus", "--once", "-v", "2", "--status-interval", "0.2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert handle.result(timeout=5) == {"total": 7}
    assert "weft_engine" in done.stdout  # the banner


def test_metrics_port_without_prometheus_client_says_what_to_install(monkeypatch):
    monkeypatch.setattr(metrics, "AVAILABLE", False)
    with pytest.raises(CommandError, match=re.escape("pip install 'weft-django[prometheus]'")):
        call_command("weft_engine", "--once", "--metrics-port", "0", "--engine-id", "no-prometheus-2")


def test_a_cancel_or_child_start_rolled_back_is_not_counted():
    """Metrics count what is durable: a cancel() in a caller's transaction that rolls back (an
    ATOMIC_REQUESTS view that then raised) ended nothing, and a child start in a commit that rolled
    back started nothing. Before: weft_workflows_finished_total{status="cancelled"} and
    weft_workflows_started_total were bumped inside the transaction."""
    from django.db import transaction

    from weft_django import events
    from weft_django.store.children import ChildStart

    weft.start("tests.signals", id="metrics-rolled-back")
    cancelled = _value("weft_workflows_finished_total", status="cancelled")
    started = _value("weft_workflows_started_total")
    child = ChildStart("metrics-kid", "tests.child", "1", "[]", "metrics-rolled-back", "run", 1, "terminate", 1)
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.cancel("metrics-rolled-back")
        events.child_started(child, "default")
        raise RuntimeError("the view failed after the cancel")
    assert _value("weft_workflows_finished_total", status="cancelled") == cancelled
    assert _value("weft_workflows_started_total") == started
    with transaction.atomic():
        weft.cancel("metrics-rolled-back")
        events.child_started(child, "default")
        assert _value("weft_workflows_finished_total", status="cancelled") == cancelled  # not durable yet
    assert _value("weft_workflows_finished_total", status="cancelled") == cancelled + 1
    assert _value("weft_workflows_started_total") == started + 1
