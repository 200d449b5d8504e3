"""The bad-input table: every case gives a typed error whose message says what to do, and leaves the
database exactly as it was (row counts of every weft table, and of the test app's tables)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pytest
from django.apps import apps
from django.core.management import call_command
from django.test import override_settings

import weft_django as weft
from weft_django.exceptions import (
    ConfigurationError,
    InvalidArgumentError,
    InvalidWorkflowIdError,
    PayloadNotSerializableError,
    PayloadSizeExceededError,
    WorkflowAlreadyExistsError,
    WorkflowDefinitionError,
    WorkflowNotFoundError,
    WorkflowNotRegisteredError,
    WorkflowStateError,
    WorkflowTerminalError,
)

pytestmark = pytest.mark.django_db


def snapshot() -> dict[str, int]:
    models = list(apps.get_app_config("weft_django").get_models()) + list(apps.get_app_config("testapp").get_models())
    return {model.__name__: model.objects.count() for model in models}


@pytest.fixture
def existing():
    """A running run, a completed run, and the ids they use."""
    running = weft.start("tests.signals", id="bad-running")
    done = weft.start("tests.sum", args=[1, 1], id="bad-done")
    from weft_django.models import Workflow

    Workflow.objects.filter(id="bad-done").update(status="completed", result="2")
    return running, done


class Unserialisable:
    pass


CASES = [
    # (case id, callable, expected exception type, a fragment of the message)
    ("unknown workflow", lambda: weft.start("no.such.workflow"), WorkflowNotRegisteredError, "Define it with"),
    ("workflow not a workflow", lambda: weft.start(print), WorkflowNotRegisteredError, "decorate it with"),
    ("empty id", lambda: weft.start("tests.sum", args=[1, 2], id=""), InvalidWorkflowIdError, "id"),
    ("id too long", lambda: weft.start("tests.sum", args=[1, 2], id="x" * 256), InvalidWorkflowIdError, "255"),
    (
        "id with control char",
        lambda: weft.start("tests.sum", args=[1, 2], id="a\nb"),
        InvalidWorkflowIdError,
        "control",
    ),
    ("id not a string", lambda: weft.start("tests.sum", args=[1, 2], id=42), InvalidWorkflowIdError, "id"),
    (
        "id and idempotency key",
        lambda: weft.start("tests.sum", args=[1, 2], id="a", idempotency_key="k"),
        InvalidArgumentError,
        "idempotency_key",
    ),
    (
        "start_after and start_at",
        lambda: weft.start("tests.sum", args=[1, 2], start_after="1s", start_at=datetime(2030, 1, 1).astimezone()),
        InvalidArgumentError,
        "start_at",
    ),
    (
        "naive start_at",
        lambda: weft.start("tests.sum", args=[1, 2], start_at=datetime(2030, 1, 1)),
        InvalidArgumentError,
        "timezone",
    ),
    (
        "bad start_after",
        lambda: weft.start("tests.sum", args=[1, 2], start_after="soon"),
        InvalidArgumentError,
        "duration",
    ),
    (
        "negative start_after",
        lambda: weft.start("tests.sum", args=[1, 2], start_after=-5),
        InvalidArgumentError,
        "negative",
    ),
    (
        "zero execution timeout",
        lambda: weft.start("tests.sum", args=[1, 2], execution_timeout=0),
        InvalidArgumentError,
        "greater than zero",
    ),
    (
        "absurd execution timeout",
        lambda: weft.start("tests.sum", args=[1, 2], execution_timeout="lots"),
        InvalidArgumentError,
        "duration",
    ),
    (
        "bad on_conflict",
        lambda: weft.start("tests.sum", args=[1, 2], on_conflict="replace"),
        InvalidArgumentError,
        "on_conflict",
    ),
    ("args not a sequence", lambda: weft.start("tests.sum", args=5), InvalidArgumentError, "args"),
    ("kwargs not a mapping", lambda: weft.start("tests.sum", kwargs=[1]), InvalidArgumentError, "kwargs"),
    (
        "non-serialisable arg",
        lambda: weft.start("tests.sum", args=[1, {"items": [1, Unserialisable()]}]),
        PayloadNotSerializableError,
        "args[1]['items'][1]",
    ),
    ("NaN arg", lambda: weft.start("tests.sum", args=[float("nan"), 1]), PayloadNotSerializableError, "args[0]"),
    (
        "Decimal NaN arg",
        lambda: weft.start("tests.sum", args=[Decimal("NaN"), 1]),
        PayloadNotSerializableError,
        "args[0]",
    ),
    (
        "set of unserialisable",
        lambda: weft.start("tests.sum", kwargs={"a": {Unserialisable()}, "b": 1}),
        PayloadNotSerializableError,
        "kwargs['a']",
    ),
    ("oversize payload", lambda: _oversize(), PayloadSizeExceededError, "PAYLOAD_MAX_BYTES"),
    ("taken id", lambda: weft.start("tests.signals", id="bad-running"), WorkflowAlreadyExistsError, "bad-running"),
    (
        "use_existing with another type",
        lambda: weft.start("tests.sum", args=[1, 1], id="bad-running", on_conflict="use_existing"),
        WorkflowAlreadyExistsError,
        "tests.signals",
    ),
    (
        "start_new over a running run",
        lambda: weft.start("tests.signals", id="bad-running", on_conflict="start_new"),
        WorkflowAlreadyExistsError,
        "running",
    ),
    ("signal to unknown id", lambda: weft.signal("nobody", "go"), WorkflowNotFoundError, "nobody"),
    ("signal to a finished run", lambda: weft.signal("bad-done", "go"), WorkflowTerminalError, "completed"),
    ("empty signal name", lambda: weft.signal("bad-running", ""), InvalidArgumentError, "name"),
    ("signal id too long", lambda: weft.signal("bad-running", "go", signal_id="s" * 321), InvalidArgumentError, "320"),
    ("empty signal id", lambda: weft.signal("bad-running", "go", signal_id=""), InvalidArgumentError, "signal_id"),
    (
        "non-serialisable signal payload",
        lambda: weft.signal("bad-running", "go", {"x": Unserialisable()}),
        PayloadNotSerializableError,
        "['x']",
    ),
    ("cancel a finished run", lambda: weft.cancel("bad-done"), WorkflowTerminalError, "bad-done"),
    ("cancel unknown id", lambda: weft.cancel("nobody"), WorkflowNotFoundError, "nobody"),
    ("suspend a finished run", lambda: weft.get_handle("bad-done").suspend(), WorkflowStateError, "suspend"),
    ("resume a running run", lambda: weft.get_handle("bad-running").resume(), WorkflowStateError, "resume"),
    ("retry a running run", lambda: weft.get_handle("bad-running").retry(), WorkflowStateError, "retry"),
    (
        "result with a bad timeout",
        lambda: weft.get_handle("bad-running").result(timeout="whenever"),
        InvalidArgumentError,
        "duration",
    ),
    ("non-generator workflow", lambda: weft.workflow(lambda ctx: 1), WorkflowDefinitionError, "generator"),
    (
        "activity timeout not a duration",
        lambda: weft.activity(timeout="fast")(lambda: 1),
        WorkflowDefinitionError,
        "duration",
    ),
    ("retry policy zero attempts", lambda: weft.RetryPolicy(max_attempts=0), WorkflowDefinitionError, "max_attempts"),
    (
        "unknown activity option",
        lambda: _an_activity().options(colour="red"),
        WorkflowDefinitionError,
        "Unknown activity option",
    ),
]


def _oversize():
    with override_settings(WEFT={"PAYLOAD_MAX_BYTES": 1000}):
        return weft.start("tests.sum", args=["x" * 2000, 1])


def _an_activity():
    from tests.testapp.workflows import add

    return add


@pytest.mark.parametrize(("case", "call", "error", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_and_changes_nothing(existing, case, call, error, fragment):
    before = snapshot()
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value), str(info.value)
    assert snapshot() == before


SETTINGS_CASES = [
    ({"OWNERSHIP": "bogus"}, "weft.E001", 'Unknown ownership posture "bogus"'),
    ({"WORKFLOW_CLAIM_TTL": "soon"}, "weft.E002", "WORKFLOW_CLAIM_TTL"),
    ({"WORKFLOW_CLAIM_TTL": "2s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"}, "weft.E007", "at least 3000ms"),
    ({"OWNERSHIP": "lease", "LEASE_TTL": 0}, "weft.E003", "requires positive LEASE_TTL"),
    ({"BACKGROUND_TASKS": "sometimes"}, "weft.E009", "BACKGROUND_TASKS must be"),
    ({"POLL_INTERVAL": 0}, "weft.E014", "POLL_INTERVAL"),
    ({"CLAIM_BATCH_SIZE": 0}, "weft.E015", "CLAIM_BATCH_SIZE"),
    ({"RETENTION": {"done": "1d"}}, "weft.E018", "RETENTION"),
]


@pytest.mark.parametrize(("weft_settings", "check_id", "fragment"), SETTINGS_CASES, ids=[c[1] for c in SETTINGS_CASES])
def test_bad_settings_are_reported_by_check_and_refused_at_start(weft_settings, check_id, fragment):
    from django.core.management.base import SystemCheckError

    from weft_django.conf import get_settings

    before = snapshot()
    with override_settings(WEFT=weft_settings):
        with pytest.raises(SystemCheckError) as info:
            call_command("check")
        assert check_id in str(info.value) and fragment in str(info.value)
        with pytest.raises(ConfigurationError):
            get_settings()
    assert snapshot() == before


def test_bad_engine_arguments():
    from django.core.management.base import CommandError

    for args in (["--concurrency", "0"], ["--concurrency", "many"], ["--drain-timeout", "-1"]):
        with pytest.raises((CommandError, SystemExit)):
            call_command("weft_engine", *args)
