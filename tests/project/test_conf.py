"""weft_django.conf: defaults, durations, and weft's ownership-options rules with their exact sentences.

No test here touches the database: pytest-django blocks it, so these also prove that reading and
validating the settings runs no query.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from weft_django import conf
from weft_django.exceptions import ConfigurationError

DURATION_FORMS = '(a timedelta, a number of seconds, or a string such as "500ms", "30s", "5m", "2h" or "7d")'


def not_a_duration(key: str, got: str) -> str:
    return f"{key} must be a duration: {DURATION_FORMS[1:-1]} (got {got})."


# One broken rule each: id -> (WEFT, the exact message). Shared with test_checks.py.
CASES: dict[str, tuple[Any, str]] = {
    "weft.E001": (
        {"OWNERSHIP": "leases"},
        "Unknown ownership posture \"leases\". Expected 'none', 'lease', or 'workflow-lease'.",
    ),
    "weft.E002": (
        {"OWNERSHIP": "workflow-lease", "WORKFLOW_CLAIM_TTL": "soon"},
        not_a_duration("WORKFLOW_CLAIM_TTL", "'soon'"),
    ),
    "weft.E003": (
        {"OWNERSHIP": "lease", "LEASE_TTL": 0, "LEASE_WAIT_TIMEOUT": -1},
        "OWNERSHIP: 'lease' requires positive LEASE_TTL, LEASE_RENEW_INTERVAL, and LEASE_WAIT_TIMEOUT "
        "(got LEASE_TTL=0ms, LEASE_RENEW_INTERVAL=5000ms, LEASE_WAIT_TIMEOUT=-1000ms).",
    ),
    "weft.E004": (
        {"OWNERSHIP": "lease", "LEASE_TTL": "10s", "LEASE_RENEW_INTERVAL": "10s"},
        "OWNERSHIP: 'lease' requires LEASE_RENEW_INTERVAL (10000ms) to be strictly less than LEASE_TTL "
        "(10000ms), so a renewal fires before the lease can lapse.",
    ),
    "weft.E005": (
        {"OWNERSHIP": "workflow-lease", "WORKFLOW_CLAIM_RENEW_INTERVAL": 0},
        "OWNERSHIP: 'workflow-lease' requires positive WORKFLOW_CLAIM_TTL and WORKFLOW_CLAIM_RENEW_INTERVAL "
        "(got WORKFLOW_CLAIM_TTL=30000ms, WORKFLOW_CLAIM_RENEW_INTERVAL=0ms).",
    ),
    "weft.E006": (
        {"WORKFLOW_CLAIM_TTL": "30s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "31s"},
        "OWNERSHIP: 'workflow-lease' requires WORKFLOW_CLAIM_RENEW_INTERVAL (31000ms) to be strictly less "
        "than WORKFLOW_CLAIM_TTL (30000ms), so a renewal fires before the claim can lapse.",
    ),
    "weft.E007": (
        {"WORKFLOW_CLAIM_TTL": "12s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "5s"},
        "OWNERSHIP: 'workflow-lease' requires WORKFLOW_CLAIM_TTL (12000ms) to be at least "
        "WORKFLOW_CLAIM_TTL_SAFETY_MULTIPLIER (3) times WORKFLOW_CLAIM_RENEW_INTERVAL (5000ms), i.e. at "
        "least 15000ms, so a stalled renewal has margin before the claim can be taken over.",
    ),
    "weft.E008": (
        {"OWNERSHIP": "workflow-lease", "DETECT_SECOND_INSTANCE": True},
        "OWNERSHIP: 'workflow-lease' cannot be combined with DETECT_SECOND_INSTANCE: True — second-instance "
        "detection assumes a single global owner.",
    ),
    "weft.E009": (
        {"BACKGROUND_TASKS": "auto"},
        'BACKGROUND_TASKS must be "automatic" or "manual" when provided',
    ),
    "weft.E010": (
        {"BACKGROUND_TASKS": "manual", "OWNERSHIP": "lease"},
        'OWNERSHIP cannot be "lease" when BACKGROUND_TASKS is "manual"',
    ),
    "weft.E011": (
        {"BACKGROUND_TASKS": "manual", "OWNERSHIP": "none", "DETECT_SECOND_INSTANCE": True},
        'DETECT_SECOND_INSTANCE cannot be enabled when BACKGROUND_TASKS is "manual"',
    ),
    "weft.E012": (["OWNERSHIP", "none"], "settings.WEFT must be a dict (got list)."),
    "weft.E013": ({"OWNERSHP": "lease"}, "Unknown key 'OWNERSHP' in settings.WEFT."),
    "weft.E014": ({"POLL_INTERVAL": 0}, "POLL_INTERVAL must be a positive duration (got 0ms)."),
    "weft.E015": ({"CLAIM_BATCH_SIZE": 0}, "CLAIM_BATCH_SIZE must be a positive integer (got 0)."),
    "weft.E016": (
        {"ACTIVITY_CONCURRENCY": "8"},
        "ACTIVITY_CONCURRENCY must be a positive integer (got '8').",
    ),
    "weft.E017": (
        {"ACTIVITY_EXECUTOR": "processes"},
        'ACTIVITY_EXECUTOR must be "threads" or "celery" (got \'processes\').',
    ),
    "weft.E018": (
        {"RETENTION": {"complete": "1d"}},
        "RETENTION has an unknown status 'complete'; its keys are the terminal statuses "
        '"completed", "failed", "cancelled" and "timed_out".',
    ),
    "weft.E019": ({"RETENTION": {"failed": -1}}, 'RETENTION["failed"] must not be negative (got -1000ms).'),
    "weft.E020": (
        {"UPDATE_RESPONSE_RETENTION": "0s"},
        "UPDATE_RESPONSE_RETENTION must be a positive duration (got 0ms).",
    ),
    "weft.E021": ({"PAYLOAD_MAX_BYTES": 0}, "PAYLOAD_MAX_BYTES must be a positive integer (got 0)."),
    "weft.E022": (
        {"DATABASE": "nope"},
        "DATABASE must name an alias in settings.DATABASES (got 'nope'; aliases: ['default']).",
    ),
    "weft.E023": (
        {"AUTODISCOVER_MODULE": ""},
        "AUTODISCOVER_MODULE must be a non-empty module name (got '').",
    ),
    "weft.E024": (
        {"DETECT_SECOND_INSTANCE": "yes"},
        "DETECT_SECOND_INSTANCE must be True or False (got 'yes').",
    ),
    "weft.E026": (
        {"PREPARED_STATEMENTS": 1},
        "PREPARED_STATEMENTS must be True or False (got 1).",
    ),
    "weft.E033": (
        {"CLAIM_AHEAD": "on"},
        "CLAIM_AHEAD must be True or False (got 'on').",
    ),
    "weft.E034": (
        {"ENGINE_SWITCH_INTERVAL": "2s"},
        "ENGINE_SWITCH_INTERVAL must be None or a duration from 1ms to 1s (got '2s').",
    ),
    "weft.E027": (
        {"HISTORY_WARN_STEPS": 0},
        "HISTORY_WARN_STEPS must be a positive integer (got 0).",
    ),
    "weft.E028": (
        {"MAX_RESIDENT_WORKFLOWS": 0},
        "MAX_RESIDENT_WORKFLOWS must be None or a positive integer (got 0).",
    ),
}


def first_error(weft: Any) -> str:
    with override_settings(WEFT=weft), pytest.raises(ConfigurationError) as caught:
        conf.get_settings()
    return str(caught.value)


def problem_ids(weft: Any) -> list[str]:
    with override_settings(WEFT=weft):
        return [problem.id for problem in conf.problems()]


def resolved(weft: Any) -> conf.WeftSettings:
    with override_settings(WEFT=weft):
        assert conf.problems() == []
        return conf.get_settings()


# --- defaults and reading ---------------------------------------------------------------------


def test_defaults_are_the_documented_ones() -> None:
    assert conf.DEFAULTS == {
        "OWNERSHIP": "workflow-lease",
        "LEASE_TTL": "30s",
        "LEASE_RENEW_INTERVAL": "5s",
        "LEASE_WAIT_TIMEOUT": "60s",
        "WORKFLOW_CLAIM_TTL": "30s",
        "WORKFLOW_CLAIM_RENEW_INTERVAL": "5s",
        "DETECT_SECOND_INSTANCE": False,
        "BACKGROUND_TASKS": "automatic",
        "POLL_INTERVAL": "1s",
        "CLAIM_BATCH_SIZE": 50,
        "ACTIVITY_EXECUTOR": "threads",
        "ACTIVITY_CONCURRENCY": 8,
        "RETENTION": {"completed": "7d", "failed": "30d", "cancelled": "7d", "timed_out": "30d"},
        "UPDATE_RESPONSE_RETENTION": "5m",
        "PAYLOAD_MAX_BYTES": 1048576,
        "AUTODISCOVER_MODULE": "workflows",
        "DATABASE": "default",
        "PREPARED_STATEMENTS": True,
        "CLAIM_AHEAD": True,
        "ENGINE_SWITCH_INTERVAL": "1ms",
        "HISTORY_WARN_STEPS": 10000,
        "MAX_RESIDENT_WORKFLOWS": None,
        "QUEUES": {},
    }


def test_empty_weft_resolves_to_the_defaults() -> None:
    assert resolved({}) == conf.WeftSettings(
        ownership="workflow-lease",
        lease_ttl=timedelta(seconds=30),
        lease_renew_interval=timedelta(seconds=5),
        lease_wait_timeout=timedelta(seconds=60),
        workflow_claim_ttl=timedelta(seconds=30),
        workflow_claim_renew_interval=timedelta(seconds=5),
        detect_second_instance=False,
        background_tasks="automatic",
        poll_interval=timedelta(seconds=1),
        claim_batch_size=50,
        activity_executor="threads",
        activity_concurrency=8,
        retention={
            "completed": timedelta(days=7),
            "failed": timedelta(days=30),
            "cancelled": timedelta(days=7),
            "timed_out": timedelta(days=30),
        },
        update_response_retention=timedelta(minutes=5),
        payload_max_bytes=1048576,
        autodiscover_module="workflows",
        database="default",
    )


def test_missing_weft_setting_means_defaults(settings: Any) -> None:
    del settings.WEFT
    assert conf.problems() == []
    assert conf.get_settings().ownership == "workflow-lease"
    assert conf.autodiscover_module() == "workflows"


def test_the_test_settings_are_valid() -> None:
    assert conf.problems() == []
    assert conf.get_settings().poll_interval == timedelta(milliseconds=100)


def test_every_access_rereads_the_setting() -> None:
    with override_settings(WEFT={"POLL_INTERVAL": "2s"}):
        assert conf.get_settings().poll_interval == timedelta(seconds=2)
        with override_settings(WEFT={"POLL_INTERVAL": "3s", "OWNERSHIP": "none"}):
            assert conf.get_settings().poll_interval == timedelta(seconds=3)
            assert conf.get_settings().ownership == "none"
        assert conf.get_settings().poll_interval == timedelta(seconds=2)
        with override_settings(WEFT={"POLL_INTERVAL": 0}):
            assert [p.id for p in conf.problems()] == ["weft.E014"]
        assert conf.problems() == []


def test_settings_fixture_is_reread(settings: Any) -> None:
    settings.WEFT = {"ACTIVITY_CONCURRENCY": 3}
    assert conf.get_settings().activity_concurrency == 3
    settings.WEFT = {"ACTIVITY_CONCURRENCY": 4}
    assert conf.get_settings().activity_concurrency == 4


def test_weft_settings_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.get_settings().ownership = "none"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (timedelta(milliseconds=250), timedelta(milliseconds=250)),
        (2, timedelta(seconds=2)),
        (0.25, timedelta(milliseconds=250)),
        ("500ms", timedelta(milliseconds=500)),
        ("1.5s", timedelta(milliseconds=1500)),
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
    ],
)
def test_every_duration_form(value: Any, expected: timedelta) -> None:
    assert resolved({"POLL_INTERVAL": value}).poll_interval == expected
    assert resolved({"UPDATE_RESPONSE_RETENTION": value}).update_response_retention == expected
    assert resolved({"RETENTION": {"completed": value}}).retention["completed"] == expected


def test_duration_forms_in_both_modes() -> None:
    lease = resolved(
        {
            "OWNERSHIP": "lease",
            "LEASE_TTL": timedelta(seconds=20),
            "LEASE_RENEW_INTERVAL": 2.5,
            "LEASE_WAIT_TIMEOUT": "2m",
        }
    )
    assert (lease.lease_ttl, lease.lease_renew_interval, lease.lease_wait_timeout) == (
        timedelta(seconds=20),
        timedelta(milliseconds=2500),
        timedelta(minutes=2),
    )
    claim = resolved({"WORKFLOW_CLAIM_TTL": "1m", "WORKFLOW_CLAIM_RENEW_INTERVAL": timedelta(seconds=20)})
    assert (claim.workflow_claim_ttl, claim.workflow_claim_renew_interval) == (
        timedelta(minutes=1),
        timedelta(seconds=20),
    )


# --- every rule: the exact sentence -----------------------------------------------------------


@pytest.mark.parametrize("check_id", sorted(CASES))
def test_each_rule_has_its_exact_message(check_id: str) -> None:
    weft, message = CASES[check_id]
    with override_settings(WEFT=weft):
        found = conf.problems()
    assert [(p.id, p.message) for p in found] == [(check_id, message)]
    assert found[0].hint
    assert first_error(weft) == message


def test_configuration_error_is_improperly_configured() -> None:
    with override_settings(WEFT={"OWNERSHIP": "x"}), pytest.raises(ImproperlyConfigured):
        conf.get_settings()


@pytest.mark.parametrize("ownership", ["none", "lease", "workflow-lease"])
def test_known_ownership_postures(ownership: str) -> None:
    assert resolved({"OWNERSHIP": ownership}).ownership == ownership


@pytest.mark.parametrize("ownership", ["", "Lease", "workflow_lease", None, 1])
def test_unknown_ownership_posture(ownership: object) -> None:
    assert first_error({"OWNERSHIP": ownership}) == (
        f"Unknown ownership posture \"{ownership}\". Expected 'none', 'lease', or 'workflow-lease'."
    )


@pytest.mark.parametrize(
    ("ownership", "key"),
    [
        ("lease", "LEASE_TTL"),
        ("lease", "LEASE_RENEW_INTERVAL"),
        ("lease", "LEASE_WAIT_TIMEOUT"),
        ("workflow-lease", "WORKFLOW_CLAIM_TTL"),
        ("workflow-lease", "WORKFLOW_CLAIM_RENEW_INTERVAL"),
    ],
)
@pytest.mark.parametrize(("value", "shown"), [("soon", "'soon'"), ("-5s", "'-5s'"), (True, "True"), (None, "None")])
def test_unparseable_duration_of_the_selected_mode_names_its_key(
    ownership: str, key: str, value: object, shown: str
) -> None:
    weft = {"OWNERSHIP": ownership, key: value}
    assert first_error(weft) == not_a_duration(key, shown)
    assert problem_ids(weft) == ["weft.E002"]


@pytest.mark.parametrize(
    ("key", "value"),
    [("POLL_INTERVAL", "fast"), ("UPDATE_RESPONSE_RETENTION", [5])],
)
def test_unparseable_duration_outside_ownership_is_always_reported(key: str, value: object) -> None:
    for ownership in ("none", "lease", "workflow-lease"):
        assert first_error({"OWNERSHIP": ownership, key: value}) == not_a_duration(key, repr(value))


def test_unparseable_retention_names_its_status() -> None:
    assert first_error({"RETENTION": {"timed_out": "forever"}}) == not_a_duration('RETENTION["timed_out"]', "'forever'")


LEASE_BROKEN = {"LEASE_TTL": "bogus", "LEASE_RENEW_INTERVAL": "1h", "LEASE_WAIT_TIMEOUT": -1}
CLAIM_BROKEN = {"WORKFLOW_CLAIM_TTL": "bogus", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1h"}


def test_invalid_lease_durations_are_ignored_under_workflow_lease() -> None:
    found = resolved({"OWNERSHIP": "workflow-lease", **LEASE_BROKEN})
    assert found.lease_ttl == timedelta(seconds=30)  # weft keeps the defaults for the unused mode
    assert found.lease_wait_timeout == timedelta(seconds=60)


def test_invalid_claim_durations_are_ignored_under_lease() -> None:
    found = resolved({"OWNERSHIP": "lease", **CLAIM_BROKEN})
    assert found.workflow_claim_ttl == timedelta(seconds=30)
    assert found.workflow_claim_renew_interval == timedelta(seconds=5)


def test_invalid_mode_durations_are_ignored_under_none() -> None:
    found = resolved({"OWNERSHIP": "none", **LEASE_BROKEN, **CLAIM_BROKEN})
    assert (found.ownership, found.lease_ttl, found.workflow_claim_ttl) == (
        "none",
        timedelta(seconds=30),
        timedelta(seconds=30),
    )


def test_unused_mode_durations_are_not_applied() -> None:
    found = resolved({"OWNERSHIP": "workflow-lease", "LEASE_TTL": "10s", "WORKFLOW_CLAIM_TTL": "45s"})
    assert (found.lease_ttl, found.workflow_claim_ttl) == (timedelta(seconds=30), timedelta(seconds=45))


def test_lease_timing_valid_and_boundaries() -> None:
    found = resolved({"OWNERSHIP": "lease", "LEASE_TTL": "10s", "LEASE_RENEW_INTERVAL": "9999ms"})
    assert found.lease_renew_interval == timedelta(milliseconds=9999)
    assert problem_ids({"OWNERSHIP": "lease", "LEASE_TTL": "10s", "LEASE_RENEW_INTERVAL": "11s"}) == ["weft.E004"]
    assert problem_ids({"OWNERSHIP": "lease", "LEASE_RENEW_INTERVAL": 0}) == ["weft.E003"]
    assert first_error({"OWNERSHIP": "lease", "LEASE_WAIT_TIMEOUT": "0s"}) == (
        "OWNERSHIP: 'lease' requires positive LEASE_TTL, LEASE_RENEW_INTERVAL, and LEASE_WAIT_TIMEOUT "
        "(got LEASE_TTL=30000ms, LEASE_RENEW_INTERVAL=5000ms, LEASE_WAIT_TIMEOUT=0ms)."
    )


def test_workflow_claim_timing_valid_and_boundaries() -> None:
    exact = resolved({"WORKFLOW_CLAIM_TTL": "15s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "5s"})
    assert exact.workflow_claim_ttl == 3 * exact.workflow_claim_renew_interval
    assert problem_ids({"WORKFLOW_CLAIM_TTL": "14999ms", "WORKFLOW_CLAIM_RENEW_INTERVAL": "5s"}) == ["weft.E007"]
    # renew == TTL breaks both E006 and E007; weft stops at E006, and so does check.
    assert problem_ids({"WORKFLOW_CLAIM_TTL": "5s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "5s"}) == ["weft.E006"]
    assert first_error({"WORKFLOW_CLAIM_TTL": -2}) == (
        "OWNERSHIP: 'workflow-lease' requires positive WORKFLOW_CLAIM_TTL and WORKFLOW_CLAIM_RENEW_INTERVAL "
        "(got WORKFLOW_CLAIM_TTL=-2000ms, WORKFLOW_CLAIM_RENEW_INTERVAL=5000ms)."
    )


def test_manual_background_tasks() -> None:
    assert resolved({"BACKGROUND_TASKS": "manual"}).background_tasks == "manual"  # workflow-lease is allowed
    assert resolved({"BACKGROUND_TASKS": "manual", "OWNERSHIP": "none"}).ownership == "none"
    assert resolved({"BACKGROUND_TASKS": "automatic", "OWNERSHIP": "lease"}).ownership == "lease"
    assert problem_ids({"BACKGROUND_TASKS": None}) == ["weft.E009"]


def test_second_instance_detection() -> None:
    assert resolved({"OWNERSHIP": "none", "DETECT_SECOND_INSTANCE": True}).detect_second_instance is True
    assert resolved({"OWNERSHIP": "lease", "DETECT_SECOND_INSTANCE": True}).detect_second_instance is True
    assert problem_ids({"DETECT_SECOND_INSTANCE": 1}) == ["weft.E024"]  # weft tests `=== true`


# --- weft's order: the first broken rule ------------------------------------------------------


@pytest.mark.parametrize(
    ("weft", "first_id", "all_ids"),
    [
        # resolveBackgroundTaskMode runs before the ownership fields, and checks
        # detectSecondInstance before ownership 'lease'.
        (
            {
                "BACKGROUND_TASKS": "manual",
                "OWNERSHIP": "lease",
                "DETECT_SECOND_INSTANCE": True,
                "LEASE_TTL": 0,
            },
            "weft.E011",
            ["weft.E011", "weft.E010", "weft.E003"],
        ),
        ({"BACKGROUND_TASKS": "x", "OWNERSHIP": "y"}, "weft.E009", ["weft.E009", "weft.E001"]),
        ({"OWNERSHIP": "y", "POLL_INTERVAL": 0}, "weft.E001", ["weft.E001", "weft.E014"]),
        (
            {"OWNERSHIP": "workflow-lease", "DETECT_SECOND_INSTANCE": True, "WORKFLOW_CLAIM_TTL": "x"},
            "weft.E008",
            ["weft.E008", "weft.E002"],
        ),
        (
            {"OWNERSHIP": "lease", "LEASE_TTL": "x", "LEASE_WAIT_TIMEOUT": "y", "POLL_INTERVAL": "z"},
            "weft.E002",
            ["weft.E002", "weft.E002", "weft.E002"],
        ),
        (
            {"OWNERSHIP": "lease", "LEASE_TTL": "1s", "LEASE_RENEW_INTERVAL": "2s", "OWNERSHP": "none"},
            "weft.E004",
            ["weft.E004", "weft.E013"],
        ),
    ],
)
def test_first_error_follows_weft_order(weft: dict[str, Any], first_id: str, all_ids: list[str]) -> None:
    assert problem_ids(weft) == all_ids
    assert all_ids[0] == first_id
    with override_settings(WEFT=weft):
        first = conf.problems()[0]
    assert first_error(weft) == first.message


def test_first_unparseable_lease_duration_is_the_first_in_key_order() -> None:
    weft = {"OWNERSHIP": "lease", "LEASE_WAIT_TIMEOUT": "y", "LEASE_RENEW_INTERVAL": "x"}
    assert first_error(weft) == not_a_duration("LEASE_RENEW_INTERVAL", "'x'")


def test_problems_lists_every_broken_rule() -> None:
    weft = {
        "BACKGROUND_TASKS": "manual",
        "OWNERSHIP": "workflow-lease",
        "DETECT_SECOND_INSTANCE": True,
        "WORKFLOW_CLAIM_TTL": "12s",
        "POLL_INTERVAL": -1,
        "CLAIM_BATCH_SIZE": True,
        "ACTIVITY_EXECUTOR": "rq",
        "ACTIVITY_CONCURRENCY": 0,
        "RETENTION": {"completed": -5, "done": "1d"},
        "UPDATE_RESPONSE_RETENTION": "never",
        "PAYLOAD_MAX_BYTES": 1.5,
        "AUTODISCOVER_MODULE": None,
        "DATABASE": "other",
        "poll_interval": "1s",
    }
    assert problem_ids(weft) == [
        "weft.E011",
        "weft.E008",
        "weft.E007",
        "weft.E014",
        "weft.E015",
        "weft.E017",
        "weft.E016",
        "weft.E018",
        "weft.E019",
        "weft.E002",
        "weft.E021",
        "weft.E023",
        "weft.E022",
        "weft.E013",
    ]


# --- the other keys ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "50", None])
@pytest.mark.parametrize(
    ("key", "check_id"),
    [
        ("CLAIM_BATCH_SIZE", "weft.E015"),
        ("ACTIVITY_CONCURRENCY", "weft.E016"),
        ("PAYLOAD_MAX_BYTES", "weft.E021"),
    ],
)
def test_positive_integers(key: str, check_id: str, value: object) -> None:
    assert first_error({key: value}) == f"{key} must be a positive integer (got {value!r})."
    assert problem_ids({key: value}) == [check_id]
    assert getattr(resolved({key: 7}), key.lower()) == 7


def test_activity_executor() -> None:
    assert resolved({"ACTIVITY_EXECUTOR": "celery"}).activity_executor == "celery"
    assert resolved({"ACTIVITY_EXECUTOR": "threads"}).activity_executor == "threads"
    assert problem_ids({"ACTIVITY_EXECUTOR": "Threads"}) == ["weft.E017"]


def test_poll_interval_must_be_positive() -> None:
    assert first_error({"POLL_INTERVAL": -0.5}) == "POLL_INTERVAL must be a positive duration (got -500ms)."
    assert resolved({"POLL_INTERVAL": "1ms"}).poll_interval == timedelta(milliseconds=1)


def test_retention() -> None:
    partial = resolved({"RETENTION": {"completed": "1d", "failed": None, "cancelled": 0}}).retention
    assert partial == {
        "completed": timedelta(days=1),
        "failed": None,  # keep for ever
        "cancelled": timedelta(0),
        "timed_out": timedelta(days=30),  # defaults fill the statuses not given
    }
    assert first_error({"RETENTION": "7d"}) == "RETENTION must be a dict of terminal status to duration (got '7d')."
    assert problem_ids({"RETENTION": None}) == ["weft.E018"]
    assert problem_ids({"RETENTION": {"completed": "-1d"}}) == ["weft.E002"]


def test_database_alias_must_exist(settings: Any) -> None:
    settings.WEFT = {"DATABASE": 5}
    assert [p.id for p in conf.problems()] == ["weft.E022"]
    settings.WEFT = {"DATABASE": "default"}
    assert conf.get_settings().database == "default"


def test_autodiscover_module_must_be_a_non_empty_string() -> None:
    assert resolved({"AUTODISCOVER_MODULE": "flows"}).autodiscover_module == "flows"
    for value in ("", "  ", None, 3):
        assert first_error({"AUTODISCOVER_MODULE": value}) == (
            f"AUTODISCOVER_MODULE must be a non-empty module name (got {value!r})."
        )


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("OWNERSHP", 'Did you mean "OWNERSHIP"?'),
        ("poll_interval", 'Did you mean "POLL_INTERVAL"?'),
        ("LEASE_TIMEOUT", 'Did you mean "LEASE_WAIT_TIMEOUT"?'),
    ],
)
def test_unknown_key_suggests_the_closest(key: str, hint: str) -> None:
    with override_settings(WEFT={key: 1}):
        (problem,) = conf.problems()
    assert (problem.id, problem.message, problem.hint) == (
        "weft.E013",
        f"Unknown key {key!r} in settings.WEFT.",
        hint,
    )


def test_unknown_key_without_a_close_match_lists_the_keys() -> None:
    with override_settings(WEFT={"ZZZ": 1}):
        (problem,) = conf.problems()
    assert problem.hint.startswith("Valid keys: OWNERSHIP, LEASE_TTL,")


@pytest.mark.parametrize("weft", [None, "workflow-lease", ("OWNERSHIP", "none")])
def test_weft_must_be_a_dict(weft: object) -> None:
    message = f"settings.WEFT must be a dict (got {type(weft).__name__})."
    assert first_error(weft) == message
    assert problem_ids(weft) == ["weft.E012"]


# --- single-key readers -----------------------------------------------------------------------


EVERYTHING_ELSE_BROKEN = {"OWNERSHIP": "bogus", "BACKGROUND_TASKS": "bogus", "POLL_INTERVAL": "x", "TYPO": 1}


def test_single_key_readers_ignore_other_broken_keys() -> None:
    weft = {
        **EVERYTHING_ELSE_BROKEN,
        "AUTODISCOVER_MODULE": "flows",
        "DATABASE": "default",
        "PAYLOAD_MAX_BYTES": 10,
    }
    with override_settings(WEFT=weft):
        assert conf.autodiscover_module() == "flows"
        assert conf.database_alias() == "default"
        assert conf.payload_max_bytes() == 10
    with override_settings(WEFT=EVERYTHING_ELSE_BROKEN):
        assert conf.autodiscover_module() == "workflows"
        assert conf.database_alias() == "default"
        assert conf.payload_max_bytes() == 1048576


@pytest.mark.parametrize(
    ("reader", "weft"),
    [
        (conf.autodiscover_module, {"AUTODISCOVER_MODULE": ""}),
        (conf.database_alias, {"DATABASE": "nope"}),
        (conf.payload_max_bytes, {"PAYLOAD_MAX_BYTES": 0}),
        (conf.payload_max_bytes, {"PAYLOAD_MAX_BYTES": "1MB"}),
        (conf.autodiscover_module, ["not", "a", "dict"]),
    ],
)
def test_single_key_readers_raise_for_their_own_key(reader: Any, weft: Any) -> None:
    with override_settings(WEFT=weft):
        expected = conf.problems()[0].message
        with pytest.raises(ConfigurationError) as caught:
            reader()
    assert str(caught.value) == expected


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "100"])
def test_max_resident_workflows_rejects(value: object) -> None:
    assert problem_ids({"MAX_RESIDENT_WORKFLOWS": value}) == ["weft.E028"]


@pytest.mark.parametrize("value", [None, 1, 10_000])
def test_max_resident_workflows_accepts(value: object) -> None:
    assert problem_ids({"MAX_RESIDENT_WORKFLOWS": value}) == []


def test_engine_switch_interval_reads_a_short_duration_or_none() -> None:
    assert resolved({}).engine_switch_interval == timedelta(milliseconds=1)
    assert resolved({"ENGINE_SWITCH_INTERVAL": None}).engine_switch_interval is None
    assert resolved({"ENGINE_SWITCH_INTERVAL": "20ms"}).engine_switch_interval == timedelta(milliseconds=20)
    assert problem_ids({"ENGINE_SWITCH_INTERVAL": "0ms"}) == ["weft.E034"]
    assert problem_ids({"ENGINE_SWITCH_INTERVAL": "soon"}) == ["weft.E002"]
