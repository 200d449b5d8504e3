"""The only reader of ``settings.WEFT``: defaults, durations and validation.

Every accessor reads the setting when it is called, so ``override_settings(WEFT=...)`` takes effect
at once. Validation follows weft's ownership-options (0.21) rule for rule and in the same order:
``get_settings()`` raises the first broken rule, as weft throws at the first; ``problems()`` lists
every broken rule for the system checks.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings

from .durations import MAX_DURATION_TEXT, DurationTooLong, InvalidDuration, to_ms
from .exceptions import ConfigurationError
from .flow import QueueConfig, parse_queue

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
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

OWNERSHIP_MODES = ("none", "lease", "workflow-lease")
BACKGROUND_TASK_MODES = ("automatic", "manual")
ACTIVITY_EXECUTORS = ("threads", "celery")
TERMINAL_STATUSES = ("completed", "failed", "cancelled", "timed_out")
WORKFLOW_CLAIM_TTL_SAFETY_MULTIPLIER = 3
LEASE_KEYS = ("LEASE_TTL", "LEASE_RENEW_INTERVAL", "LEASE_WAIT_TIMEOUT")
WORKFLOW_CLAIM_KEYS = ("WORKFLOW_CLAIM_TTL", "WORKFLOW_CLAIM_RENEW_INTERVAL")
DURATION_HINT = 'Use a timedelta, a number of seconds, or a string such as "500ms", "30s", "5m", "2h" or "7d".'

_DEFAULT_LEASE_MS = tuple(to_ms(DEFAULTS[key]) for key in LEASE_KEYS)
_DEFAULT_CLAIM_MS = tuple(to_ms(DEFAULTS[key]) for key in WORKFLOW_CLAIM_KEYS)

T = TypeVar("T")


@dataclass(frozen=True)
class WeftSettings:
    """The validated WEFT settings, durations as timedeltas (``get_settings()``)."""

    ownership: str
    lease_ttl: timedelta
    lease_renew_interval: timedelta
    lease_wait_timeout: timedelta
    workflow_claim_ttl: timedelta
    workflow_claim_renew_interval: timedelta
    detect_second_instance: bool
    background_tasks: str
    poll_interval: timedelta
    claim_batch_size: int
    activity_executor: str
    activity_concurrency: int
    retention: dict[str, timedelta | None]  # None: keep runs in that status for ever
    update_response_retention: timedelta
    payload_max_bytes: int
    autodiscover_module: str
    database: str
    prepared_statements: bool = True
    claim_ahead: bool = True  # a backlog's next batch is claimed and run while the commit is in flight
    # weft_engine's sys.setswitchinterval (None: Python's own, 5 ms): how soon a thread back from the
    # database (the commit thread, the LISTEN thread, an activity) gets the interpreter from a busy loop
    engine_switch_interval: timedelta | None = timedelta(milliseconds=1)
    history_warn_steps: int | None = 10000  # None: never warn
    max_resident_workflows: int | None = None  # None: every held workflow stays in memory
    queues: Mapping[str, QueueConfig] = field(default_factory=dict)  # WEFT["QUEUES"], by name


@dataclass(frozen=True)
class SettingsProblem:
    """One broken rule: its check id ("weft.E001"), weft's sentence, and what to do about it."""

    id: str
    message: str
    hint: str


def _ms(value: int) -> timedelta:
    return timedelta(milliseconds=value)


class _Validation:
    """One pass over a WEFT dict. Each method reads one rule's keys and reports what it breaks."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw
        self.problems: list[SettingsProblem] = []

    def value(self, key: str) -> Any:
        return self.raw.get(key, DEFAULTS[key])

    def report(self, check_id: str, message: str, hint: str) -> None:
        self.problems.append(SettingsProblem(f"weft.{check_id}", message, hint))

    def duration_ms(self, name: str, value: Any) -> int | None:
        try:
            return to_ms(value, name)
        except DurationTooLong as exc:
            self.report("E002", str(exc), f"Use a duration of at most {MAX_DURATION_TEXT}.")
            return None
        except InvalidDuration as exc:
            self.report("E002", str(exc), DURATION_HINT)
            return None

    def background_tasks(self) -> str:
        """weft's resolveBackgroundTaskMode: the mode, then what manual mode cannot run."""
        mode = self.value("BACKGROUND_TASKS")
        if mode not in BACKGROUND_TASK_MODES:
            self.report(
                "E009",
                'BACKGROUND_TASKS must be "automatic" or "manual" when provided',
                'Set it to "automatic" (the engine runs maintenance) or "manual" (the host calls '
                "weft.run_maintenance()), or remove it.",
            )
            return str(mode)
        if mode == "manual":
            if self.value("DETECT_SECOND_INSTANCE") is True:
                self.report(
                    "E011",
                    'DETECT_SECOND_INSTANCE cannot be enabled when BACKGROUND_TASKS is "manual"',
                    'Set DETECT_SECOND_INSTANCE to False, or BACKGROUND_TASKS to "automatic".',
                )
            if self.value("OWNERSHIP") == "lease":
                self.report(
                    "E010",
                    'OWNERSHIP cannot be "lease" when BACKGROUND_TASKS is "manual"',
                    'Use OWNERSHIP "workflow-lease" (run_maintenance() renews its claims), or '
                    'BACKGROUND_TASKS "automatic".',
                )
        return str(mode)

    def ownership(self) -> str | None:
        mode = self.value("OWNERSHIP")
        if mode in OWNERSHIP_MODES:
            return str(mode)
        self.report(
            "E001",
            f"Unknown ownership posture \"{mode}\". Expected 'none', 'lease', or 'workflow-lease'.",
            'Set OWNERSHIP to "workflow-lease" (several engines), "lease" (one engine at a time) or "none".',
        )
        return None

    def lease_timing(self) -> tuple[int, int, int] | None:
        ttl, renew, wait = (self.duration_ms(key, self.value(key)) for key in LEASE_KEYS)
        if ttl is None or renew is None or wait is None:
            return None
        if ttl <= 0 or renew <= 0 or wait <= 0:
            self.report(
                "E003",
                "OWNERSHIP: 'lease' requires positive LEASE_TTL, LEASE_RENEW_INTERVAL, and "
                f"LEASE_WAIT_TIMEOUT (got LEASE_TTL={ttl}ms, LEASE_RENEW_INTERVAL={renew}ms, "
                f"LEASE_WAIT_TIMEOUT={wait}ms).",
                'Give all three a positive duration; the defaults are "30s", "5s" and "60s".',
            )
        elif renew >= ttl:
            self.report(
                "E004",
                f"OWNERSHIP: 'lease' requires LEASE_RENEW_INTERVAL ({renew}ms) to be strictly less than "
                f"LEASE_TTL ({ttl}ms), so a renewal fires before the lease can lapse.",
                'Lower LEASE_RENEW_INTERVAL or raise LEASE_TTL; the defaults are "5s" and "30s".',
            )
        return ttl, renew, wait

    def workflow_claim_timing(self) -> tuple[int, int] | None:
        if self.value("DETECT_SECOND_INSTANCE") is True:
            self.report(
                "E008",
                "OWNERSHIP: 'workflow-lease' cannot be combined with DETECT_SECOND_INSTANCE: True "
                "— second-instance detection assumes a single global owner.",
                "Remove DETECT_SECOND_INSTANCE: per-workflow claims already keep engines apart.",
            )
        ttl, renew = (self.duration_ms(key, self.value(key)) for key in WORKFLOW_CLAIM_KEYS)
        if ttl is None or renew is None:
            return None
        required = WORKFLOW_CLAIM_TTL_SAFETY_MULTIPLIER * renew
        hint = 'Keep WORKFLOW_CLAIM_TTL at least 3 times WORKFLOW_CLAIM_RENEW_INTERVAL (defaults "30s", "5s").'
        if ttl <= 0 or renew <= 0:
            self.report(
                "E005",
                "OWNERSHIP: 'workflow-lease' requires positive WORKFLOW_CLAIM_TTL and "
                f"WORKFLOW_CLAIM_RENEW_INTERVAL (got WORKFLOW_CLAIM_TTL={ttl}ms, "
                f"WORKFLOW_CLAIM_RENEW_INTERVAL={renew}ms).",
                hint,
            )
        elif renew >= ttl:
            self.report(
                "E006",
                f"OWNERSHIP: 'workflow-lease' requires WORKFLOW_CLAIM_RENEW_INTERVAL ({renew}ms) to be "
                f"strictly less than WORKFLOW_CLAIM_TTL ({ttl}ms), so a renewal fires before the claim "
                "can lapse.",
                hint,
            )
        elif ttl < required:
            self.report(
                "E007",
                f"OWNERSHIP: 'workflow-lease' requires WORKFLOW_CLAIM_TTL ({ttl}ms) to be at least "
                f"WORKFLOW_CLAIM_TTL_SAFETY_MULTIPLIER ({WORKFLOW_CLAIM_TTL_SAFETY_MULTIPLIER}) times "
                f"WORKFLOW_CLAIM_RENEW_INTERVAL ({renew}ms), i.e. at least {required}ms, so a stalled "
                "renewal has margin before the claim can be taken over.",
                hint,
            )
        return ttl, renew

    def positive_duration(self, key: str, check_id: str, why: str) -> timedelta:
        ms = self.duration_ms(key, self.value(key))
        if ms is not None and ms <= 0:
            self.report(check_id, f"{key} must be a positive duration (got {ms}ms).", f"Set {key} to {why}.")
        return _ms(ms or 0)

    def positive_int(self, key: str, check_id: str, why: str) -> int:
        value = self.value(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.report(check_id, f"{key} must be a positive integer (got {value!r}).", f"Set {key} to {why}.")
            return 0
        return value

    def payload_max_bytes(self) -> int:
        return self.positive_int("PAYLOAD_MAX_BYTES", "E021", "a positive number of bytes such as 1048576")

    def activity_executor(self) -> str:
        value = self.value("ACTIVITY_EXECUTOR")
        if value not in ACTIVITY_EXECUTORS:
            self.report(
                "E017",
                f'ACTIVITY_EXECUTOR must be "threads" or "celery" (got {value!r}).',
                'Set ACTIVITY_EXECUTOR to "threads" (a pool in the engine) or "celery" (Celery workers).',
            )
        return str(value)

    def boolean(self, key: str, check_id: str, hint: str) -> bool:
        value = self.value(key)
        if not isinstance(value, bool):
            self.report(check_id, f"{key} must be True or False (got {value!r}).", hint)
        return value is True

    def detect_second_instance(self) -> bool:
        return self.boolean("DETECT_SECOND_INSTANCE", "E024", "Set DETECT_SECOND_INSTANCE to True or False.")

    def prepared_statements(self) -> bool:
        return self.boolean("PREPARED_STATEMENTS", "E026", "Set PREPARED_STATEMENTS to True (the default) or False.")

    def claim_ahead(self) -> bool:
        return self.boolean("CLAIM_AHEAD", "E033", "Set CLAIM_AHEAD to True (the default) or False.")

    def engine_switch_interval(self) -> timedelta | None:
        value = self.value("ENGINE_SWITCH_INTERVAL")
        if value is None:
            return None
        ms = self.duration_ms("ENGINE_SWITCH_INTERVAL", value)  # None: reported already (weft.E002)
        if ms is None:
            return None
        if not 1 <= ms <= 1000:
            self.report(
                "E034",
                f"ENGINE_SWITCH_INTERVAL must be None or a duration from 1ms to 1s (got {value!r}).",
                'Set ENGINE_SWITCH_INTERVAL to a duration such as "1ms" (the default), or None to keep Python\'s '
                "own switch interval (5 ms).",
            )
            return None
        return _ms(ms)

    def history_warn_steps(self) -> int | None:
        value = self.value("HISTORY_WARN_STEPS")
        if value is None:
            return None
        return self.positive_int("HISTORY_WARN_STEPS", "E027", "a positive number of steps such as 10000, or None")

    def max_resident_workflows(self) -> int | None:
        value = self.value("MAX_RESIDENT_WORKFLOWS")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.report(
                "E028",
                f"MAX_RESIDENT_WORKFLOWS must be None or a positive integer (got {value!r}).",
                "Set MAX_RESIDENT_WORKFLOWS to None (keep every held workflow in memory, the default) or to the "
                "number of workflow generators one engine may keep in memory, such as 10000.",
            )
            return None
        return value

    def retention(self) -> dict[str, timedelta | None]:
        given = self.value("RETENTION")
        hint = 'Map "completed", "failed", "cancelled" and "timed_out" to a duration, or None to keep for ever.'
        if not isinstance(given, Mapping):
            self.report("E018", f"RETENTION must be a dict of terminal status to duration (got {given!r}).", hint)
            return {}
        for status in given:
            if status not in TERMINAL_STATUSES:
                self.report(
                    "E018",
                    f"RETENTION has an unknown status {status!r}; its keys are the terminal statuses "
                    '"completed", "failed", "cancelled" and "timed_out".',
                    hint,
                )
        result: dict[str, timedelta | None] = {}
        for status in TERMINAL_STATUSES:
            value = given.get(status, DEFAULTS["RETENTION"][status])
            ms = None if value is None else self.duration_ms(f'RETENTION["{status}"]', value)
            if ms is not None and ms < 0:
                self.report("E019", f'RETENTION["{status}"] must not be negative (got {ms}ms).', hint)
            result[status] = None if ms is None else _ms(ms)
        return result

    def autodiscover_module(self) -> str:
        value = self.value("AUTODISCOVER_MODULE")
        if not isinstance(value, str) or not value.strip():
            self.report(
                "E023",
                f"AUTODISCOVER_MODULE must be a non-empty module name (got {value!r}).",
                'Set AUTODISCOVER_MODULE to the module imported from every installed app, e.g. "workflows".',
            )
            return ""
        return value

    def database(self) -> str:
        alias = self.value("DATABASE")
        aliases = list(getattr(settings, "DATABASES", {}))
        if not isinstance(alias, str) or alias not in aliases:
            self.report(
                "E022",
                f"DATABASE must name an alias in settings.DATABASES (got {alias!r}; aliases: {aliases}).",
                "Set DATABASE to the alias that holds weft's tables, or add that alias to DATABASES.",
            )
        return str(alias)

    def queues(self) -> dict[str, QueueConfig]:
        """WEFT["QUEUES"]: {name: {"concurrency", "per_engine", "rate", "priorities"}} (E029-E032)."""
        given = self.value("QUEUES")
        hint = 'e.g. QUEUES = {"emails": {"concurrency": 10, "per_engine": 4, "rate": "100/m", "priorities": True}}.'
        if not isinstance(given, Mapping):
            self.report("E029", f"QUEUES must be a dict of queue name to its limits (got {given!r}).", hint)
            return {}
        found: dict[str, QueueConfig] = {}
        for name, raw in given.items():
            config, broken = parse_queue(name, raw)
            for check_id, message in broken:
                self.report(check_id, message, hint)
            if config is not None:
                found[config.name] = config
        return found

    def unknown_keys(self) -> None:
        for key in self.raw:
            if key not in DEFAULTS:
                close = difflib.get_close_matches(str(key).upper(), list(DEFAULTS), n=1)
                hint = f'Did you mean "{close[0]}"?' if close else f"Valid keys: {', '.join(DEFAULTS)}."
                self.report("E013", f"Unknown key {key!r} in settings.WEFT.", hint)


def _not_a_dict(raw: object) -> SettingsProblem:
    return SettingsProblem(
        "weft.E012",
        f"settings.WEFT must be a dict (got {type(raw).__name__}).",
        "Set WEFT to a dict of the keys in docs/settings.md, or remove it to use the defaults.",
    )


def _raw_weft() -> Mapping[str, Any] | SettingsProblem:
    raw = getattr(settings, "WEFT", {})
    return raw if isinstance(raw, Mapping) else _not_a_dict(raw)


def _evaluate() -> tuple[WeftSettings | None, list[SettingsProblem]]:
    raw = _raw_weft()
    if isinstance(raw, SettingsProblem):
        return None, [raw]
    check = _Validation(raw)
    background_tasks = check.background_tasks()
    ownership = check.ownership()
    # Each mode's durations are read only when that mode is selected; otherwise the defaults hold.
    lease = (check.lease_timing() if ownership == "lease" else None) or _DEFAULT_LEASE_MS
    claim = (check.workflow_claim_timing() if ownership == "workflow-lease" else None) or _DEFAULT_CLAIM_MS
    detect_second_instance = check.detect_second_instance()
    poll_interval = check.positive_duration("POLL_INTERVAL", "E014", 'a positive duration such as "1s"')
    claim_batch_size = check.positive_int("CLAIM_BATCH_SIZE", "E015", "a positive integer such as 50")
    activity_executor = check.activity_executor()
    activity_concurrency = check.positive_int("ACTIVITY_CONCURRENCY", "E016", "a positive integer such as 8")
    retention = check.retention()
    update_response_retention = check.positive_duration(
        "UPDATE_RESPONSE_RETENTION", "E020", 'a positive duration such as "5m"'
    )
    payload_max = check.payload_max_bytes()
    module = check.autodiscover_module()
    database = check.database()
    prepared = check.prepared_statements()
    claim_ahead = check.claim_ahead()
    switch_interval = check.engine_switch_interval()
    history_warn = check.history_warn_steps()
    max_resident = check.max_resident_workflows()
    queues = check.queues()
    check.unknown_keys()
    if check.problems or ownership is None:
        return None, check.problems
    return WeftSettings(
        ownership=ownership,
        lease_ttl=_ms(lease[0]),
        lease_renew_interval=_ms(lease[1]),
        lease_wait_timeout=_ms(lease[2]),
        workflow_claim_ttl=_ms(claim[0]),
        workflow_claim_renew_interval=_ms(claim[1]),
        detect_second_instance=detect_second_instance,
        background_tasks=background_tasks,
        poll_interval=poll_interval,
        claim_batch_size=claim_batch_size,
        activity_executor=activity_executor,
        activity_concurrency=activity_concurrency,
        retention=retention,
        update_response_retention=update_response_retention,
        payload_max_bytes=payload_max,
        autodiscover_module=module,
        database=database,
        prepared_statements=prepared,
        claim_ahead=claim_ahead,
        engine_switch_interval=switch_interval,
        history_warn_steps=history_warn,
        max_resident_workflows=max_resident,
        queues=queues,
    ), []


def problems() -> list[SettingsProblem]:
    """Every broken rule in ``settings.WEFT``, in weft's order (what ``manage.py check`` reports)."""
    return _evaluate()[1]


def describe_problems(found: list[SettingsProblem]) -> str:
    """``found`` as ``manage.py check`` words them, one per line: "weft.E013: <message> HINT: <hint>"."""
    return "\n".join(f"{p.id}: {p.message} HINT: {p.hint}" for p in found)


_warned: set[str] = set()


def warn_if_invalid() -> None:
    """Log once (WARNING, logger weft_django.conf) each distinct set of broken rules in ``settings.WEFT``,
    for callers that work without the full settings (``start()`` needs only DATABASE and
    PAYLOAD_MAX_BYTES): a typo is then heard of before an engine refuses to start. Never raises."""
    try:
        raw = getattr(settings, "WEFT", None)
        if raw is None:
            return
        fingerprint = (
            repr(sorted(raw.items(), key=lambda item: str(item[0]))) if isinstance(raw, Mapping) else repr(raw)
        )
        if fingerprint in _warned:
            return
        found = problems()
        _warned.add(fingerprint)
    except Exception:  # a warning must never break the caller
        return
    if found:
        logger.warning(
            "settings.WEFT is invalid; weft_engine will refuse to start until it is fixed:\n%s",
            describe_problems(found),
        )


def get_settings() -> WeftSettings:
    """The validated settings; ConfigurationError with the first broken rule's message, as weft throws."""
    resolved, found = _evaluate()
    if resolved is None:
        raise ConfigurationError(found[0].message)
    return resolved


def _one_key(read: Callable[[_Validation], T]) -> T:
    """Read a single key, raising only for that key (or a WEFT that is not a dict)."""
    raw = _raw_weft()
    if isinstance(raw, SettingsProblem):
        raise ConfigurationError(raw.message)
    check = _Validation(raw)
    value = read(check)
    if check.problems:
        raise ConfigurationError(check.problems[0].message)
    return value


def autodiscover_module() -> str:
    """WEFT["AUTODISCOVER_MODULE"]; safe in AppConfig.ready() while other keys are broken."""
    return _one_key(_Validation.autodiscover_module)


def database_alias() -> str:
    """WEFT["DATABASE"], the alias of weft's tables; ignores every other key."""
    return _one_key(_Validation.database)


def prepared_statements() -> bool:
    """WEFT["PREPARED_STATEMENTS"]; ignores every other key."""
    return _one_key(_Validation.prepared_statements)


def payload_max_bytes() -> int:
    """WEFT["PAYLOAD_MAX_BYTES"]; ignores every other key."""
    return _one_key(_Validation.payload_max_bytes)


def history_warn_steps() -> int | None:
    """WEFT["HISTORY_WARN_STEPS"] (None: off); ignores every other key."""
    return _one_key(_Validation.history_warn_steps)


def queues() -> dict[str, QueueConfig]:
    """WEFT["QUEUES"] parsed, by name; ignores every other key.

    Raises:
        ConfigurationError: a queue entry is broken (the first problem's message).
    """
    return _one_key(_Validation.queues)
