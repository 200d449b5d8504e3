"""OpenTelemetry spans (the optional ``[otel]`` extra: ``opentelemetry-api``).

A no-op unless ``opentelemetry`` is importable and the application configured a TracerProvider
(``opentelemetry.trace.set_tracer_provider``): then ``span`` yields None and ``capture`` returns
None, so nothing is recorded and nothing is written. Nothing here imports opentelemetry at module
level.

The caller's trace context crosses the database as text: ``capture()`` serialises the current
context with the W3C Trace Context propagator (``{"traceparent": ..., "tracestate": ...}`` as
JSON), the client stores it with the run (``Workflow.trace_context``), a signal or an update, and
the engine and the Celery worker start their spans under it (``span(..., carrier=text)``).

Spans (docs/tracing.md):

- ``weft.start`` (client, PRODUCER): a start; the run's spans are its children.
- ``weft.workflow.turn`` (engine): one pass of the engine over one workflow.
- ``weft.activity.attempt`` (engine thread, or CONSUMER on a Celery worker): one activity attempt.
- ``weft.signal`` (client, PRODUCER) and ``weft.signal.deliver`` (engine, CONSUMER, linked to the run).
- ``weft.update`` (client, PRODUCER) and ``weft.update.deliver`` (engine, CONSUMER, linked to the run).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

TRACER_NAME = "weft_django"
MAX_CARRIER = 1024  # a longer serialised context (a huge tracestate) is not stored

_MISSING = object()
_api: Any = _MISSING  # the opentelemetry modules, or None: imported on first use
_environment_provider: bool | None = None  # OTEL_PYTHON_TRACER_PROVIDER is set (read on first use)
_warned = False  # a tracing failure was logged with its traceback (later ones at DEBUG)
logger = logging.getLogger(__name__)
_NOOP: contextlib.AbstractContextManager[None] = contextlib.nullcontext()  # span() while tracing is off


def _otel() -> Any:
    """(trace, propagator, context) of opentelemetry-api, or None when it is not installed."""
    global _api
    if _api is _MISSING:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            _api = None
        else:
            _api = (trace, TraceContextTextMapPropagator(), context)
    return _api


def reset() -> None:
    """Forget what was imported and what the environment said (tests that hide or restore opentelemetry)."""
    global _api, _environment_provider
    _api, _environment_provider = _MISSING, None


def enabled() -> bool:
    """Whether spans are recorded: opentelemetry is installed and a TracerProvider is configured.

    Asked several times per workflow per engine pass. With no provider set in code, opentelemetry's
    ``get_tracer_provider`` looks up ``OTEL_PYTHON_TRACER_PROVIDER`` in the environment on every call
    (most of this function's cost); that variable is read once per process here, and the provider
    set in code (``trace.set_tracer_provider``, opentelemetry's global) is looked at on every call,
    so one set at any time is used from the next call on."""
    api = _otel()
    if api is None:
        return False
    trace = api[0]
    if getattr(trace, "_TRACER_PROVIDER", _MISSING) is None and not _provider_from_environment():
        return False
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _provider_from_environment() -> bool:
    """Whether OTEL_PYTHON_TRACER_PROVIDER names a provider (read once per process; reset() forgets it)."""
    global _environment_provider
    if _environment_provider is None:
        _environment_provider = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
    return _environment_provider


def capture() -> str | None:
    """The current trace context as text to store (None: tracing is off, or no span is current)."""
    if not enabled():
        return None
    trace, propagator, _ = _otel()
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    if not carrier:
        return None
    text = json.dumps(carrier, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= MAX_CARRIER else None


def _extract(text: str | None) -> Any:
    """The context stored as ``text`` (an empty context for None or unreadable text)."""
    _, propagator, context = _otel()
    carrier: Any = None
    if text:
        try:
            carrier = json.loads(text)
        except ValueError:
            carrier = None
    if not isinstance(carrier, dict):
        return context.Context()
    return propagator.extract({str(k): str(v) for k, v in carrier.items()}, context=context.Context())


def _link(text: str | None) -> Any:
    trace = _otel()[0]
    span_context = trace.get_current_span(_extract(text)).get_span_context()
    return trace.Link(span_context) if span_context.is_valid else None


def span(
    name: str,
    *,
    carrier: Any = _MISSING,
    kind: str = "INTERNAL",
    attributes: Mapping[str, Any] | None = None,
    links: Sequence[str | None] = (),
) -> contextlib.AbstractContextManager[Any]:
    """A span named ``name``, current inside the block; yields it, or None when tracing is off.

    Args:
        carrier: the stored context (``capture()``'s text) the span is a child of; None: a new
            trace. Left out: the caller's current context (the client side).
        kind: the SpanKind's name (INTERNAL, PRODUCER, CONSUMER, CLIENT, SERVER).
        attributes: its attributes (None values are left out).
        links: stored contexts the span links to (a signal's delivery links to its run).
    """
    if not enabled():
        return _NOOP  # the engine opens several per workflow and pass: nothing to build when off
    return _recorded(name, carrier, kind, attributes, links)


@contextlib.contextmanager
def _recorded(
    name: str, carrier: Any, kind: str, attributes: Mapping[str, Any] | None, links: Sequence[str | None]
) -> Iterator[Any]:
    """The span, current inside the block; None (and the block runs all the same) when the SDK or
    one of the application's span processors raised while starting it. Ending it (its processors'
    ``on_end``, a synchronous exporter) never raises either: tracing must not break the engine."""
    try:
        trace, _, context = _otel()
        parent = None if carrier is _MISSING else _extract(carrier)
        found = [link for link in (_link(text) for text in links if text) if link is not None]
        values = {key: value for key, value in (attributes or {}).items() if value is not None}
        current = trace.get_tracer(TRACER_NAME).start_span(
            name, context=parent, kind=getattr(trace.SpanKind, kind), attributes=values, links=found
        )
    except Exception:
        _failed(name, "started")
        yield None
        return
    token = context.attach(trace.set_span_in_context(current))
    try:
        yield current
    except Exception as exc:  # recorded as start_as_current_span does, then raised on
        _quietly(name, "marked failed", _record_error, current, exc)
        raise
    finally:
        context.detach(token)
        _quietly(name, "ended", current.end)


def _record_error(current: Any, exc: Exception) -> None:
    trace = _otel()[0]
    if current.is_recording():
        current.record_exception(exc)
        current.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _quietly(name: str, what: str, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        _failed(name, what)


def _failed(name: str, what: str) -> None:
    """Log a tracing failure: with its traceback the first time in this process, briefly after."""
    global _warned
    if _warned:
        logger.debug("tracing: span %s could not be %s", name, what, exc_info=True)
        return
    _warned = True
    logger.exception(
        "tracing: span %s could not be %s (a span processor or exporter raised); the work goes on without it "
        "(later failures are logged at DEBUG)",
        name,
        what,
    )


def set_attribute(current: Any, key: str, value: Any) -> None:
    """Set an attribute on a span ``span`` yielded (nothing for None)."""
    if current is not None and value is not None:
        _quietly(str(getattr(current, "name", "?")), f"given the attribute {key}", current.set_attribute, key, value)
