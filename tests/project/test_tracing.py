"""OpenTelemetry spans (weft_django/tracing.py, docs/tracing.md), with the SDK's in-memory exporter:
a start, the run's turns and activity attempts in the caller's trace (the context carried through
the database), signal and update delivery, a Celery worker's attempt, and nothing recorded or stored
without a configured TracerProvider or without opentelemetry at all."""

from __future__ import annotations

import json
import queue
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import weft_django as weft
from tests.celery.test_celery_fencing import running_attempt
from tests.testapp import workflows as testflows
from weft_django import tracing
from weft_django.codec import encode_payload
from weft_django.engine import remote
from weft_django.models import BufferedSignal, PendingUpdate, Workflow
from weft_django.testing import running_engine

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A TracerProvider for this test only (the global one is left unset after it)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    tracing.reset()
    yield exporter
    provider.shutdown()
    tracing.reset()


def _named(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _only(exporter: InMemorySpanExporter, name: str) -> Any:
    found = _named(exporter, name)
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


@pytest.mark.parametrize("how", ["plain", "id", "idempotency_key", "start_after"])
def test_a_start_its_turns_and_attempts_share_the_callers_trace(spans, weft_run_until_idle, how):
    options: dict[str, Any] = {
        "plain": {},
        "id": {"id": "otel-start"},
        "idempotency_key": {"idempotency_key": "otel-key"},
        "start_after": {"start_after": "0s"},
    }[how]
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        handle = weft.start("tests.three_steps", args=["otel"], **options)
    trace_id = request.get_span_context().trace_id
    start = _only(spans, "weft.start")
    assert start.parent.span_id == request.get_span_context().span_id
    assert start.kind == trace.SpanKind.PRODUCER
    assert start.attributes["weft.workflow_id"] == handle.id
    assert start.attributes["weft.workflow_type"] == "tests.three_steps"
    stored = json.loads(Workflow.objects.get(pk=handle.id).trace_context)
    assert stored["traceparent"].split("-")[1] == f"{trace_id:032x}"

    weft_run_until_idle()
    assert handle.result(timeout=5)[0].endswith("otel-1")
    turns = _named(spans, "weft.workflow.turn")
    attempts = _named(spans, "weft.activity.attempt")
    assert len(turns) >= 4 and len(attempts) == 3  # a turn per step settled, and the end
    for span in turns + attempts:
        assert span.context.trace_id == trace_id
        assert span.parent.span_id == start.context.span_id  # children of the start
        assert span.attributes["weft.workflow_id"] == handle.id
    assert [a.attributes["weft.seq"] for a in sorted(attempts, key=lambda s: s.start_time)] == [0, 1, 2]
    assert {a.attributes["weft.activity"] for a in attempts} == {testflows.record_call.name}
    assert any(t.attributes["weft.finished"] for t in turns)


def test_a_childs_run_joins_its_parents_trace(spans, weft_run_until_idle):
    handle = weft.start("tests.parent", args=["otel-kid"], kwargs={"children": 2})
    weft_run_until_idle()
    assert handle.result(timeout=5)
    start = _only(spans, "weft.start")
    kids = {s.attributes["weft.workflow_id"] for s in _named(spans, "weft.workflow.turn")} - {handle.id}
    assert len(kids) == 2
    for span in _named(spans, "weft.workflow.turn") + _named(spans, "weft.activity.attempt"):
        assert span.parent.span_id == start.context.span_id
    assert Workflow.objects.filter(parent_id=handle.id, trace_context__isnull=False).count() == 2


def test_a_failing_attempt_records_its_error(spans, weft_run_until_idle):
    handle = weft.start("tests.non_retryable", args=["otel-refuses"])
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"type": "ValueError", "attempts": 1}
    [attempt] = _named(spans, "weft.activity.attempt")
    assert attempt.attributes["weft.outcome"] == "failed"


def test_a_signal_is_delivered_in_the_senders_trace_linked_to_the_run(spans, weft_run_until_idle):
    handle = weft.start("tests.signals")
    weft_run_until_idle()
    start = _only(spans, "weft.start")
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("webhook") as webhook:
        weft.signal(handle.id, "go", {"n": 1})
    sent = _only(spans, "weft.signal")
    assert sent.parent.span_id == webhook.get_span_context().span_id
    assert sent.attributes["weft.signal"] == "go"
    assert BufferedSignal.objects.get(workflow_id=handle.id).trace_context is not None

    weft_run_until_idle()
    assert handle.result(timeout=5) == {"n": 1}
    delivered = _only(spans, "weft.signal.deliver")
    assert delivered.kind == trace.SpanKind.CONSUMER
    assert delivered.context.trace_id == webhook.get_span_context().trace_id
    assert delivered.parent.span_id == sent.context.span_id
    assert [link.context.span_id for link in delivered.links] == [start.context.span_id]


def test_an_update_is_delivered_in_the_senders_trace(spans):
    handle = weft.start("tests.msg_counter")
    tracer = trace.get_tracer("test")
    with running_engine("otel-updates"):
        with tracer.start_as_current_span("api") as api:
            assert handle.update("add", 3, timeout="20s") == 3
        weft.signal(handle.id, "stop")
    sent = _only(spans, "weft.update")
    assert sent.parent.span_id == api.get_span_context().span_id
    assert PendingUpdate.objects.get(workflow_id=handle.id).trace_context is not None
    delivered = _only(spans, "weft.update.deliver")
    assert delivered.parent.span_id == sent.context.span_id
    assert delivered.attributes["weft.update"] == "add"
    assert [link.context.span_id for link in delivered.links] == [_only(spans, "weft.start").context.span_id]


def test_a_celery_workers_attempt_joins_the_runs_trace(spans):
    key = running_attempt("tests.celery_echo", ["k"], activity=testflows.celery_echo.name)
    context = Workflow.objects.get(pk=key.workflow_id).trace_context
    start = _only(spans, "weft.start")
    args = encode_payload({"args": ["k", 1], "kwargs": {}})
    disposition = remote.run_attempt(key, testflows.celery_echo.name, args, worker="w1", trace_context=context)
    assert disposition == remote.Disposition.RECORDED
    attempt = _only(spans, "weft.activity.attempt")
    assert attempt.kind == trace.SpanKind.CONSUMER
    assert attempt.parent.span_id == start.context.span_id
    assert (attempt.attributes["weft.worker"], attempt.attributes["weft.outcome"]) == ("w1", "recorded")


def test_the_celery_executor_sends_the_runs_context_with_the_attempt(spans):
    pytest.importorskip("celery")
    from weft_django.engine.activities import AttemptTask
    from weft_django.engine.celery_executor import CeleryExecutor
    from weft_django.registry import registry
    from weft_django.store.clock import db_now

    class App:
        sent: list[dict[str, Any]] = []

        def send_task(self, name: str, **options: Any) -> None:
            self.sent.append(options["kwargs"])

    key = running_attempt("tests.celery_echo", ["k"], activity=testflows.celery_echo.name)
    context = Workflow.objects.get(pk=key.workflow_id).trace_context
    task = AttemptTask(
        key.workflow_id,
        key.run_id,
        key.seq,
        key.attempt,
        key.epoch,
        registry.activity(testflows.celery_echo.name),
        encode_payload({"args": ["k", 1], "kwargs": {}}),
        db_now(),
        None,
        trace_context=context,
    )
    app = App()
    executor = CeleryExecutor("owner", queue.SimpleQueue(), "default", 1.0, app=app)  # type: ignore[arg-type]
    task.control = remote.RemoteControl(task.control.info, key, "default", executor._forget)  # as submit() does
    assert executor._send([task]) == []
    assert app.sent[0]["trace_context"] == context


def test_without_a_tracer_provider_nothing_is_recorded_or_stored(weft_run_until_idle):
    assert not tracing.enabled()
    assert tracing.capture() is None
    handle = weft.start("tests.signals")
    weft_run_until_idle()
    weft.signal(handle.id, "go", 2)
    weft_run_until_idle()
    assert handle.result(timeout=5) == 2
    assert Workflow.objects.get(pk=handle.id).trace_context is None
    assert BufferedSignal.objects.get(workflow_id=handle.id).trace_context is None


def test_without_opentelemetry_installed_everything_works(monkeypatch, weft_run_until_idle):
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import opentelemetry raises ImportError
    tracing.reset()
    try:
        assert not tracing.enabled()
        with tracing.span("weft.start", carrier=None) as span:
            assert span is None
        handle = weft.start("tests.sum", args=[1, 2])
        weft_run_until_idle()
        assert handle.result(timeout=5) == {"total": 3}
        assert Workflow.objects.get(pk=handle.id).trace_context is None
    finally:
        monkeypatch.undo()
        tracing.reset()


def test_outside_a_span_a_start_begins_its_own_trace_and_bad_contexts_are_ignored(spans, weft_run_until_idle):
    assert tracing.capture() is None  # no current span: nothing to store
    handle = weft.start("tests.sum", args=[1, 2])
    start = _only(spans, "weft.start")
    assert start.parent is None
    Workflow.objects.filter(pk=handle.id).update(trace_context="not json")
    weft_run_until_idle()
    assert handle.result(timeout=5) == {"total": 3}
    for turn in _named(spans, "weft.workflow.turn"):
        assert turn.parent is None  # an unreadable context starts a new trace, it breaks nothing


def test_a_provider_set_after_the_first_call_is_used_from_the_next_call_on(monkeypatch):
    """enabled() is asked several times per workflow per engine pass and skips opentelemetry's
    environment lookup while no provider is set; one set later is still seen at once."""
    tracing.reset()
    assert not tracing.enabled()
    with tracing.span("weft.test") as span:
        assert span is None
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider())
    assert tracing.enabled()
    with tracing.span("weft.test") as span:
        assert span is not None
    monkeypatch.undo()
    assert not tracing.enabled()


class _RaisingProcessor(SpanProcessor):
    """An application's span processor with a bug: it raises when a span starts, or when one ends."""

    def __init__(self, when: str) -> None:
        self.when = when

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.when == "start":
            raise RuntimeError("span processor broke on_start")

    def on_end(self, span: Any) -> None:
        if self.when == "end":
            raise RuntimeError("span processor broke on_end")


@pytest.mark.parametrize("when", ["start", "end"])
def test_a_raising_span_processor_breaks_neither_the_client_nor_the_engine(monkeypatch, weft_run_until_idle, when):
    """Tracing must never break the engine: a processor that raises (the SDK does not catch it) cost
    the span, not the work. Before: every turn raised, each run was made stuck and retried forever."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # before the broken one (the SDK stops at it)
    provider.add_span_processor(_RaisingProcessor(when))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    tracing.reset()
    try:
        handle = weft.start("tests.three_steps", args=["otel-broken"])
        failing = weft.start("tests.non_retryable", args=["otel-broken-refuses"])
        weft_run_until_idle()
        assert handle.result(timeout=5)[0].endswith("otel-broken-1")
        assert failing.result(timeout=5) == {"type": "ValueError", "attempts": 1}
        assert not Workflow.objects.filter(stuck_error__isnull=False).exists()
        if when == "end":  # the spans are still exported by the processor before it
            assert _named(exporter, "weft.activity.attempt")
    finally:
        provider.shutdown()
        tracing.reset()
