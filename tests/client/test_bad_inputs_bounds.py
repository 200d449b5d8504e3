"""Issue 21 item 8, the client half: every duration has an upper bound checked where it enters, and
every text input is checked for NUL characters and lone surrogates, in one helper
(``weft_django.validation``). Each case raises a typed error whose message names the rule (the bound,
NUL, the surrogate) and leaves the database exactly as it was: row counts of every table, and the
state of the rows a refused call would have changed (status, cancel reason, schedule note).

Before, these ended in raw ``OverflowError`` / ``DataError`` / ``UnicodeEncodeError`` (or were stored:
a 2 MB or non-str cancel reason, a row dated in year 10000 that then broke the admin and the CLI)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

import weft_django as weft
from tests.client.test_bad_inputs import snapshot
from weft_django.client import WorkflowHandle
from weft_django.exceptions import (
    ConfigurationError,
    InvalidArgumentError,
    InvalidScheduleError,
    InvalidWorkflowIdError,
)
from weft_django.models import Schedule, Workflow
from weft_django.schedules import ScheduleHandle

pytestmark = pytest.mark.django_db

NUL = "a\x00b"
SURROGATE = "a\ud800b"
BOUND = "100 years"  # durations.MAX_DURATION, named in every too-long message
YEAR_9999 = datetime(9999, 12, 31, tzinfo=UTC)


@pytest.fixture
def existing():
    """A waiting run, a schedule, and a completed run."""
    weft.start("tests.signals", id="bad-running")
    weft.start("tests.sum", args=[1, 1], id="bad-done")
    Workflow.objects.filter(id="bad-done").update(status="completed", result="2")
    weft.schedule("tests.sum", id="bad-schedule", every=60, args=[1, 2])


def state() -> dict[str, object]:
    """Row counts, plus what a refused cancel, pause or start would have changed."""
    return {
        **snapshot(),
        "workflows": sorted(Workflow.objects.values_list("id", "status", "cancel_reason", "execution_deadline")),
        "schedules": sorted(Schedule.objects.values_list("id", "paused", "note")),
    }


def _start(**options):
    return lambda: weft.start("tests.sum", args=[1, 2], **options)


CASES = [
    # (case id, callable, expected exception type, a fragment of the message)
    # -- durations: each one bounded by MAX_DURATION where it enters
    ("start_after 10**12 s", _start(start_after=10**12), InvalidArgumentError, BOUND),
    ("start_after 10**20 s", _start(start_after=10**20), InvalidArgumentError, BOUND),
    ("start_after 1e300 s", _start(start_after=1e300), InvalidArgumentError, BOUND),
    ("start_after timedelta.max", _start(start_after=timedelta.max), InvalidArgumentError, BOUND),
    ("start_after '99999999d'", _start(start_after="99999999d"), InvalidArgumentError, BOUND),
    (
        "start_after 10**12 with a timeout",
        _start(start_after=10**12, execution_timeout="2d"),
        InvalidArgumentError,
        BOUND,
    ),
    (
        "start_at 9999-12-31 with a timeout",
        _start(start_at=YEAR_9999, execution_timeout="2d"),
        InvalidArgumentError,
        BOUND,
    ),
    ("start_at 9999-12-31", _start(start_at=YEAR_9999), InvalidArgumentError, "start_at must be at most"),
    ("start_at datetime.max", _start(start_at=datetime.max.replace(tzinfo=UTC)), InvalidArgumentError, BOUND),
    ("execution_timeout timedelta.max", _start(execution_timeout=timedelta.max), InvalidArgumentError, BOUND),
    ("execution_timeout 10**20 s", _start(execution_timeout=10**20), InvalidArgumentError, BOUND),
    (
        "execution_timeout 101 years",
        _start(id="long", execution_timeout=timedelta(days=36_501)),
        InvalidArgumentError,
        BOUND,
    ),
    (
        "result timeout timedelta.max",
        lambda: weft.get_handle("bad-running").result(timeout=timedelta.max),
        InvalidArgumentError,
        BOUND,
    ),
    (
        "query timeout 10**20 s",
        lambda: weft.query("bad-running", "state", timeout=10**20),
        InvalidArgumentError,
        BOUND,
    ),
    (
        "update timeout timedelta.max",
        lambda: weft.update("bad-running", "approve", timeout=timedelta.max),
        InvalidArgumentError,
        BOUND,
    ),
    # -- NUL characters: PostgreSQL cannot store them (a raw DataError before)
    ("NUL in a signal name", lambda: weft.signal("bad-running", NUL), InvalidArgumentError, "NUL"),
    ("NUL in a signal id", lambda: weft.signal("bad-running", "go", signal_id=NUL), InvalidArgumentError, "NUL"),
    ("NUL in an idempotency key", _start(idempotency_key=NUL), InvalidArgumentError, "NUL"),
    ("NUL in an update name", lambda: weft.update("bad-running", NUL), InvalidArgumentError, "NUL"),
    (
        "NUL in an update's idempotency key",
        lambda: weft.update("bad-running", "approve", idempotency_key=NUL),
        InvalidArgumentError,
        "NUL",
    ),
    ("NUL in a query name", lambda: weft.query("bad-running", NUL), InvalidArgumentError, "NUL"),
    ("NUL in a cancel reason", lambda: weft.cancel("bad-running", NUL), InvalidArgumentError, "NUL"),
    (
        "NUL in a handle's cancel reason",
        lambda: weft.get_handle("bad-running").cancel(NUL),
        InvalidArgumentError,
        "NUL",
    ),
    (
        "NUL in a schedule note",
        lambda: weft.get_schedule("bad-schedule").pause(NUL),
        InvalidScheduleError,
        "NUL",
    ),
    (
        "NUL in start_or_signal's signal name",
        lambda: weft.start_or_signal("tests.signals", NUL, id="bad-running"),
        InvalidArgumentError,
        "NUL",
    ),
    (
        "NUL in start_with_update's update name",
        lambda: weft.start_with_update("tests.signals", NUL, id="bad-running"),
        InvalidArgumentError,
        "NUL",
    ),
    # -- lone surrogates: they cannot be encoded as UTF-8 (a raw UnicodeEncodeError before)
    ("surrogate in a workflow id", _start(id=SURROGATE), InvalidWorkflowIdError, "surrogate"),
    ("surrogate in a handle's id", lambda: WorkflowHandle(SURROGATE), InvalidWorkflowIdError, "surrogate"),
    ("surrogate in get_handle", lambda: weft.get_handle(SURROGATE), InvalidWorkflowIdError, "surrogate"),
    ("surrogate in signal's id", lambda: weft.signal(SURROGATE, "go"), InvalidWorkflowIdError, "surrogate"),
    ("surrogate in cancel's id", lambda: weft.cancel(SURROGATE), InvalidWorkflowIdError, "surrogate"),
    ("surrogate in an idempotency key", _start(idempotency_key=SURROGATE), InvalidArgumentError, "surrogate"),
    ("surrogate in a signal name", lambda: weft.signal("bad-running", SURROGATE), InvalidArgumentError, "surrogate"),
    (
        "surrogate in a signal id",
        lambda: weft.signal("bad-running", "go", signal_id=SURROGATE),
        InvalidArgumentError,
        "surrogate",
    ),
    ("surrogate in an update name", lambda: weft.update("bad-running", SURROGATE), InvalidArgumentError, "surrogate"),
    ("surrogate in a query name", lambda: weft.query("bad-running", SURROGATE), InvalidArgumentError, "surrogate"),
    ("surrogate in a cancel reason", lambda: weft.cancel("bad-running", SURROGATE), InvalidArgumentError, "surrogate"),
    (
        "surrogate in a schedule id",
        lambda: weft.schedule("tests.sum", id=SURROGATE, every=60, args=[1, 2]),
        InvalidScheduleError,
        "surrogate",
    ),
    (
        "surrogate in a cron expression",
        lambda: weft.schedule("tests.sum", id="bad-cron", cron=f"* * * * {SURROGATE}", args=[1, 2]),
        InvalidScheduleError,
        "surrogate",
    ),
    ("surrogate in get_schedule", lambda: weft.get_schedule(SURROGATE), InvalidScheduleError, "surrogate"),
    ("surrogate in a schedule handle", lambda: ScheduleHandle(SURROGATE), InvalidScheduleError, "surrogate"),
    (
        "surrogate in a schedule note",
        lambda: weft.get_schedule("bad-schedule").pause(SURROGATE),
        InvalidScheduleError,
        "surrogate",
    ),
    # -- cancel reasons: a str, and bounded
    ("cancel reason an object", lambda: weft.cancel("bad-running", object()), InvalidArgumentError, "must be a str"),
    ("cancel reason a dict", lambda: weft.cancel("bad-running", {"why": 1}), InvalidArgumentError, "must be a str"),
    ("cancel reason 1001 chars", lambda: weft.cancel("bad-running", "x" * 1001), InvalidArgumentError, "1000"),
    ("cancel reason 2 MB", lambda: weft.cancel("bad-running", "x" * 2_000_000), InvalidArgumentError, "1000"),
    (
        "schedule note 1001 chars",
        lambda: weft.get_schedule("bad-schedule").pause("x" * 1001),
        InvalidScheduleError,
        "1000",
    ),
]


@pytest.mark.parametrize(("case", "call", "error", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_and_changes_nothing(existing, case, call, error, fragment):
    before = state()
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value), str(info.value)
    assert state() == before


# ------------------------------------------------------------------------------------------ settings

SETTINGS_CASES = [
    ({"POLL_INTERVAL": 10**30}, "POLL_INTERVAL"),
    ({"POLL_INTERVAL": timedelta.max}, "POLL_INTERVAL"),
    ({"WORKFLOW_CLAIM_TTL": 10**20}, "WORKFLOW_CLAIM_TTL"),
    ({"UPDATE_RESPONSE_RETENTION": "99999999d"}, "UPDATE_RESPONSE_RETENTION"),
    ({"RETENTION": {"completed": 10**30}}, 'RETENTION["completed"]'),
    ({"OWNERSHIP": "lease", "LEASE_TTL": 10**30}, "LEASE_TTL"),
]


@pytest.mark.parametrize(("weft_settings", "key"), SETTINGS_CASES, ids=[c[1] for c in SETTINGS_CASES])
def test_too_long_setting_is_reported_by_check_and_refused_at_start(weft_settings, key):
    from django.core.management.base import SystemCheckError

    from weft_django.conf import get_settings

    before = snapshot()
    with override_settings(WEFT=weft_settings):
        with pytest.raises(SystemCheckError) as info:
            call_command("check")
        assert "weft.E002" in str(info.value) and key in str(info.value) and BOUND in str(info.value)
        with pytest.raises(ConfigurationError) as refused:
            get_settings()
        assert BOUND in str(refused.value)
    assert snapshot() == before


# ------------------------------------------------------------------------------ the admin and the CLI

ADMIN = "/admin/weft_django"


@pytest.mark.parametrize("reason", [NUL, "why\x00"], ids=["NUL inside", "NUL at the end"])
def test_admin_cancel_form_refuses_a_nul_reason(admin_client, existing, reason):
    before = state()
    response = admin_client.post(f"{ADMIN}/workflow/bad-running/act/cancel/", {"reason": reason}, follow=True)
    assert response.status_code == 200
    shown = [str(message) for message in response.context["messages"]]
    assert any("Nothing was cancelled" in text and "NUL" in text for text in shown), shown
    assert state() == before


CLI_CASES = [
    ("cancel reason with NUL", ["cancel", "bad-running", "--reason", NUL, "--yes"], "NUL"),
    ("signal name with NUL", ["signal", "bad-running", NUL], "NUL"),
    ("signal id with NUL", ["signal", "bad-running", "go", "--signal-id", NUL], "NUL"),
    ("update key with NUL", ["update", "bad-running", "approve", "--idempotency-key", NUL], "NUL"),
    ("start with a surrogate id", ["start", "tests.sum", "--args", "[1, 2]", "--id", SURROGATE], "surrogate"),
    ("describe a surrogate id", ["describe", SURROGATE], "surrogate"),
    ("query timeout too long", ["query", "bad-running", "state", "--timeout", "99999999d"], BOUND),
]


@pytest.mark.parametrize(("case", "args", "fragment"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_bad_input_and_changes_nothing(existing, case, args, fragment):
    before = state()
    with pytest.raises((CommandError, SystemExit)) as info:
        call_command("weft", *args, stdout=StringIO(), stderr=StringIO())
    if isinstance(info.value, CommandError):
        assert fragment in str(info.value), str(info.value)
    assert state() == before


# ---------------------------------------------------------------------------------- typed outcomes


@pytest.mark.django_db(transaction=True)
def test_result_timeout_is_the_typed_wait_timeout_and_a_builtin_timeout():
    weft.start("tests.signals", id="bad-running")  # committed: result() reads on its own connection
    before = state()
    with pytest.raises(weft.WaitTimeoutError) as info:
        weft.get_handle("bad-running").result(timeout="10ms")
    assert isinstance(info.value, TimeoutError)  # API.md: the builtin TimeoutError still catches it
    assert isinstance(info.value, weft.WeftError)
    assert "bad-running" in str(info.value) and "result() again" in str(info.value)
    assert state() == before


def test_the_longest_accepted_durations_start_and_are_stored(existing):
    """The bound is inclusive and usable: 100 years of delay plus 100 years of deadline is a valid date."""
    handle = weft.start("tests.sum", args=[1, 2], start_after=timedelta(days=36_500), execution_timeout="36500d")
    row = Workflow.objects.get(pk=handle.id)
    assert row.status == "pending" and row.execution_deadline - row.start_at == timedelta(days=36_500)
    assert weft.get_handle(handle.id).describe()["status"] == "pending"
