"""The chaos run: engine subprocesses, a mixed workload, a client that signals and updates, a fault
schedule, then the invariant checker (tests/chaos/invariants.py) and the figures.

Faults are triggered by progress (completed steps / expected steps), not by time, so a loaded machine
changes how long a run takes, not what it exercises. Waits that prove liveness (a dead engine's claims
taken over) have a generous deadline and count a violation when it passes; nothing asserts speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, connections
from django.db.models import Count

import weft_django as weft
from tests.chaos import audit
from tests.chaos.audit import AckedMessage
from tests.chaos.invariants import AckedSignal, AckedUpdate, Expectations, check
from tests.testapp.models import ActivityCall
from weft_django import client as weft_client
from weft_django.exceptions import UpdateTimeoutError, UpdateValidationError, WeftError
from weft_django.models import Step, Workflow, WorkflowClaim
from weft_django.status import ACTIVE_STATUSES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEDULE_ID = "chaos-tick"
# Workflows whose code is one step after another (the audit's order check applies to their runs).
SEQUENTIAL_TYPES = {
    "tests.chaos_mixed",
    "tests.chaos_leaf",
    "tests.chaos_approve",
    "tests.scheduled_run",
    "tests.chaos_chain",
}


USER_LOCK_SECONDS = 1.5  # how long a "user_lock" fault holds its rows


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill" | "freeze" | "cut" | "user_lock" | "pg_restart" | "pg_crash"
    at: float  # progress (0..1) at which it is injected


@dataclass
class Plan:
    name: str
    workflows: int
    engines: int
    faults: list[Fault]
    ttl_ms: int = 2000
    renew_ms: int = 500
    concurrency: int = 16
    claim_batch: int = 10
    client_threads: int = 6
    slow_every: int = 5  # every 5th workflow's first activity sleeps past its timeout
    fail_every: int = 4  # every 4th one's first activity fails once
    child_every: int = 3  # every 3rd one starts a child
    schedule_every: int = 1  # seconds
    slack_s: float = 20.0  # extra allowance (loaded machine) for liveness waits
    # When a SIGSTOP may land: "any" (the default) takes the first moment; "in_transaction" retries
    # until the engine has an open transaction (test_engine_findings.py, finding 2, now fixed); "idle"
    # until it has none. Env: WEFT_CHAOS_FREEZE_WHEN.
    freeze_when: str = field(default_factory=lambda: os.environ.get("WEFT_CHAOS_FREEZE_WHEN", "any"))
    deadline_s: float = 600.0  # the whole run
    # tests.chaos_approve workflows: an activity, then wait_for_update("approve"), a signal "poke" and a
    # last activity; the client times "approve", "poke" and a "late" signal against the activities.
    approvals: int = 0
    # tests.chaos_chain workflows: three runs of continue-as-new, each an activity, a child with the
    # default id (a later run's names its run) and a sleep; no client interaction.
    chains: int = 0
    audit: bool = True  # record every write (tests/chaos/audit.py) and check the log afterwards
    # MAX_RESIDENT_WORKFLOWS of the engines (None: no limit): a small one evicts the parked approvals,
    # whose claims are then dormant (ADR 0014) when the faults hit.
    resident: int | None = None


class ChaosEngine:
    """A ``weft_engine`` subprocess on the chaos database (given by environment, like the engines of
    a deployment): its sessions are named ``weft-<id>`` so faults can find them."""

    def __init__(self, engine_id: str, plan: Plan, db: dict[str, str]) -> None:
        self.engine_id = engine_id
        self.log_path = f"/tmp/weft-chaos-{plan.name}-{engine_id}-{os.getpid()}.log"
        overrides = {
            "WORKFLOW_CLAIM_TTL": f"{plan.ttl_ms}ms",
            "WORKFLOW_CLAIM_RENEW_INTERVAL": f"{plan.renew_ms}ms",
            "CLAIM_BATCH_SIZE": plan.claim_batch,
            # Settled update rows are deleted after this; the checker needs every one of the run's.
            "UPDATE_RESPONSE_RETENTION": "1h",
            "MAX_RESIDENT_WORKFLOWS": plan.resident,
        }
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "WEFT_TEST_DB": "postgres",
            "WEFT_PG_HOST": db["HOST"],
            "WEFT_PG_PORT": str(db["PORT"]),
            "WEFT_PG_NAME": db["NAME"],
            "WEFT_PG_USER": db["USER"],
            "WEFT_TEST_OVERRIDES": json.dumps(overrides),
            "PGAPPNAME": f"weft-{engine_id}"[:63],
        }
        command = [sys.executable, "-m", "django", "weft_engine", "--engine-id", engine_id]
        command += ["--concurrency", str(plan.concurrency)]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        self.state = "alive"

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(30)
        self._log.close()

    def output(self) -> str:
        with open(self.log_path) as handle:
            return handle.read()


def _tolerant(fn: Any, default: Any = None) -> Any:
    """A read of the test process that meets a terminated connection or a restarting server answers
    ``default`` (the caller polls again)."""
    try:
        return fn()
    except (DatabaseError, InterfaceError):
        connections.close_all()
        return default


def db_settings(using: str = "default") -> dict[str, str]:
    """Where this process's database is (the suite's test database or the private cluster)."""
    settings = connections[using].settings_dict
    return {
        "HOST": settings["HOST"] or "127.0.0.1",
        "PORT": str(settings["PORT"] or "5432"),
        "NAME": str(settings["NAME"]),
        "USER": str(settings["USER"] or "postgres"),
    }


@dataclass
class Run:
    plan: Plan
    cluster: Any = None  # a PrivateCluster when the plan restarts PostgreSQL
    engines: list[ChaosEngine] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)  # how faults landed (not faults themselves)
    signals: list[AckedSignal] = field(default_factory=list)
    acked: list[AckedMessage] = field(default_factory=list)  # for the audit: what the client was told is durable
    updates: list[AckedUpdate] = field(default_factory=list)
    dead: set[str] = field(default_factory=set)
    liveness_violations: list[str] = field(default_factory=list)
    client_retries: int = 0
    client_errors: list[str] = field(default_factory=list)  # calls answered with an unexpected error
    stopping: threading.Event = field(default_factory=threading.Event)  # the run failed: clients give up
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- engines and faults ----------------------------------------------------------------------
    def start_engine(self) -> ChaosEngine:
        engine = ChaosEngine(f"{self.plan.name}-e{len(self.engines) + 1}", self.plan, db_settings())
        self.engines.append(engine)
        return engine

    def count(self, kind: str, n: int = 1) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + n

    def _busiest(self) -> ChaosEngine:
        alive = [e for e in self.engines if e.state == "alive"]
        held = dict(
            _tolerant(
                lambda: list(
                    WorkflowClaim.objects.filter(engine_id__in=[e.engine_id for e in alive])
                    .values("engine_id")
                    .annotate(n=Count("workflow_id"))
                    .values_list("engine_id", "n")
                ),
                [],
            )
        )
        return max(alive, key=lambda e: held.get(e.engine_id, 0))

    def _await_takeover(self, engine: ChaosEngine) -> None:
        """A dead (or frozen) engine's claims must all be taken over within TTL + grace + slack."""
        plan = self.plan
        deadline = time.monotonic() + (plan.ttl_ms + 2 * plan.renew_ms) / 1000 + plan.slack_s
        while time.monotonic() < deadline:
            held = _tolerant(
                lambda: WorkflowClaim.objects.filter(engine_id=engine.engine_id, workflow_id__in=_running()).count(), 1
            )
            if held == 0:
                return
            time.sleep(0.1)
        sessions = _tolerant(lambda: session_states(engine.engine_id), [])
        if engine.state == "frozen" and any(state == "idle in transaction" for state, *_ in sessions):
            # Idle in a transaction far past the engine sessions' idle bound: only a transaction that
            # runs workflow code (update handlers and validators, ADR 0009) has no bound, and a frozen
            # engine caught inside one keeps that workflow's claim until it thaws, by design
            # (store/sessions.py allow_user_code). The thaw that follows must be refused or finish.
            self.notes["frozen_inside_user_code"] = self.notes.get("frozen_inside_user_code", 0) + 1
            return
        self.liveness_violations.append(
            f"{engine.engine_id}: claims not taken over within TTL + grace + slack; its sessions: {sessions}"
        )

    def inject(self, fault: Fault) -> None:
        plan = self.plan
        if fault.kind == "kill":
            victim = self._busiest()
            victim.signal(signal.SIGKILL)
            victim.state = "dead"
            self.dead.add(victim.engine_id)
            self.count("sigkill")
            self.start_engine()  # a replacement, as an orchestrator would start
            self._await_takeover(victim)
        elif fault.kind == "freeze":
            victim = self._busiest()
            for _ in range(50):
                victim.signal(signal.SIGSTOP)
                time.sleep(0.3)  # let statements in flight finish in the server
                inside = _tolerant(lambda: open_transactions(victim.engine_id), 0) > 0
                if plan.freeze_when == "any" or inside == (plan.freeze_when == "in_transaction"):
                    break
                # Not the moment asked for (freeze_when): let it run a little and try again.
                victim.signal(signal.SIGCONT)
                self.notes["freeze_retried"] = self.notes.get("freeze_retried", 0) + 1
                time.sleep(0.05)
            where = "sigstops_inside_a_transaction" if inside else "sigstops_outside_a_transaction"
            self.notes[where] = self.notes.get(where, 0) + 1
            victim.state = "frozen"
            self.count("sigstop_past_ttl")
            time.sleep((plan.ttl_ms + 2 * plan.renew_ms) / 1000)  # past TTL + grace for sure
            self._await_takeover(victim)
            victim.signal(signal.SIGCONT)  # the zombie wakes up: its late writes must be refused
            victim.state = "alive"
        elif fault.kind == "cut":
            victim = self._busiest()
            killed = _tolerant(lambda: terminate_backends(victim.engine_id), 0)
            self.count("pg_terminate_backend", max(killed, 0))
        elif fault.kind == "user_lock":
            # A user's open transaction holding the rows of a few running workflows (their workflow and
            # step rows) for longer than a pass: their commits are carried, the others go on.
            from tests.engine.test_commit_locks import holding

            sql = (
                "SELECT 1 FROM weft_django_workflow w JOIN weft_django_step s ON s.workflow_id = w.id "
                "WHERE w.id IN (SELECT id FROM weft_django_workflow WHERE status = %s ORDER BY id LIMIT 5) "
                "FOR UPDATE OF w, s"
            )
            with holding(sql, ["running"], hold_at_most=USER_LOCK_SECONDS + 5):
                time.sleep(USER_LOCK_SECONDS)
            self.count("user_row_lock")
        elif fault.kind in ("pg_restart", "pg_crash"):
            assert self.cluster is not None, "a PostgreSQL restart needs the private cluster"
            self.cluster.restart("fast" if fault.kind == "pg_restart" else "immediate", down_for=1.0)
            connections.close_all()
            self.count("postgres_restart_fast" if fault.kind == "pg_restart" else "postgres_crash_restart")
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")

    # -- the client: signals and updates, retried until acknowledged ---------------------------------
    def _call(self, fn: Any, deadline: float, trail: list[str]) -> Any:
        while True:
            try:
                return fn()
            except (UpdateTimeoutError, DatabaseError, InterfaceError, TimeoutError) as error:
                trail.append(type(error).__name__)
                # Not acknowledged: retry with the same signal id / idempotency key.
                with self._lock:
                    self.client_retries += 1
                connections.close_all()
                if time.monotonic() > deadline or self.stopping.is_set():
                    raise
                time.sleep(0.2)

    def drive(self, key: str, deadline: float) -> None:
        trail: list[str] = []  # what each call met, for the report
        try:
            self._drive(key, deadline, trail)
        except WeftError as error:  # the workflow's own state shows why (invariants report it)
            with self._lock:
                self.client_errors.append(f"{key}: {type(error).__name__}: {error} (after {trail})")
        finally:
            connections.close_all()

    def _drive(self, key: str, deadline: float, trail: list[str]) -> None:
        for _ in range(2):  # the second is a duplicate: same signal id, a no-op
            self._call(lambda: weft.signal(key, "go", key, signal_id=f"{key}:go"), deadline, trail)
            trail.append("signal ok")
        with self._lock:
            self.signals.append(AckedSignal(key, "go", f"{key}:go"))
            self.acked.append(AckedMessage(key, "signal", f"{key}:go"))
        # The rejected one first: once both valid ones are applied the workflow may end at once.
        for amount, suffix in ((-5, "bad"), (1, "add1"), (2, "add2")):
            ack = AckedUpdate(key, "add", f"{key}:{suffix}", "completed")
            for _ in range(2 if suffix == "add1" else 1):  # a retry with the same key: same answer
                try:
                    ack.responses.append(
                        self._call(
                            lambda a=amount, s=suffix: weft.update(
                                key, "add", a, idempotency_key=f"{key}:{s}", timeout="5s"
                            ),
                            deadline,
                            trail,
                        )
                    )
                    trail.append(f"{suffix} ok")
                except UpdateValidationError as error:
                    ack.outcome = "rejected"
                    ack.responses.append(error.issues)
            with self._lock:
                self.updates.append(ack)
                if ack.outcome == "completed":
                    self.acked.append(AckedMessage(key, "update", ack.key, via="handler"))

    def drive_approve(self, key: str, seconds: float, timing: str, deadline: float) -> None:
        trail: list[str] = []
        try:
            self._drive_approve(key, seconds, timing, deadline, trail)
        except WeftError as error:
            with self._lock:
                self.client_errors.append(f"{key}: {type(error).__name__}: {error} (after {trail})")
        finally:
            connections.close_all()

    def _when(self, key: str, activity: str, seconds: float, timing: str, deadline: float) -> None:
        """Wait for the moment a message should land: "early" at once (it waits at the frontier while
        the activity runs), "completing" just before the activity's first attempt returns (it started
        ``seconds`` ago: its ActivityCall row), "after" once its step is settled."""
        if timing == "early":
            return
        while time.monotonic() < deadline and not self.stopping.is_set():
            if timing == "completing":
                started = _tolerant(
                    lambda: (
                        ActivityCall.objects.filter(name="chaos_flip", key__startswith=f"{activity}@")
                        .order_by("created_at")
                        .values_list("created_at", flat=True)
                        .first()
                    )
                )
                if started is not None:
                    # Land within the last tenth of the activity's sleep (its row was written as it began).
                    time.sleep(max(0.0, seconds * 0.9 - (time.time() - started.timestamp())))
                    return
            elif _tolerant(
                lambda: (
                    Step.objects.filter(workflow_id=key, name__endswith="chaos_flip", status="completed")
                    .filter(seq=0 if activity.endswith(":a") else 3)
                    .exists()
                ),
                False,
            ):
                return
            time.sleep(0.02)

    def _drive_approve(self, key: str, seconds: float, timing: str, deadline: float, trail: list[str]) -> None:
        self._when(key, f"{key}:a", seconds, timing, deadline)
        if timing == "after" and self.plan.resident is not None:
            # Parked across several renewal passes: evicted past plan.resident, its claim renewed dormant.
            time.sleep(PARKED_S)
        self._call(lambda: weft.signal(key, "poke", key, signal_id=f"{key}:poke"), deadline, trail)
        trail.append("poke ok")
        with self._lock:
            self.signals.append(AckedSignal(key, "poke", f"{key}:poke"))
            self.acked.append(AckedMessage(key, "signal", f"{key}:poke"))
        ack = AckedUpdate(key, "approve", f"{key}:approve", "completed", via="wait")
        ack.responses.append(
            self._call(
                lambda: weft.update(key, "approve", key, idempotency_key=f"{key}:approve", timeout="30s"),
                deadline,
                trail,
            )
        )
        trail.append("approve ok")
        with self._lock:
            self.updates.append(ack)
            self.acked.append(AckedMessage(key, "update", ack.key, via="wait"))
        # The last activity: a signal nobody waits for, sent as the run is about to end. It must end
        # dropped (or consumed), never left buffered on the finished run.
        self._when(key, f"{key}:last", seconds, "after" if timing == "after" else "completing", deadline)
        try:
            self._call(lambda: weft.signal(key, "late", key, signal_id=f"{key}:late"), deadline, trail)
        except WeftError as error:  # the run ended first: refused, so not acknowledged
            trail.append(f"late refused: {type(error).__name__}")
            return
        trail.append("late ok")
        with self._lock:
            self.signals.append(AckedSignal(key, "late", f"{key}:late", consumed_expected=False))
            self.acked.append(AckedMessage(key, "signal", f"{key}:late"))


def _running() -> Any:
    return Workflow.objects.filter(status="running").values("id")


def terminate_backends(engine_id: str) -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            [f"weft-{engine_id}"[:63]],
        )
        return int(cursor.fetchone()[0])


def open_transactions(engine_id: str) -> int:
    """Sessions of the engine inside a transaction (a SIGSTOPped one keeps its row locks)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT NULL",
            [f"weft-{engine_id}"[:63]],
        )
        return int(cursor.fetchone()[0])


def session_states(engine_id: str) -> list[tuple[str, str]]:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT state, left(query, 80) FROM pg_stat_activity"
            " WHERE application_name = %s AND xact_start IS NOT NULL",
            [f"weft-{engine_id}"[:63]],
        )
        return [tuple(row) for row in cursor.fetchall()]


def expected_result(key: str, child: bool) -> dict[str, Any]:
    return {
        "first": f"{key}:first",
        "go": key,
        "reached": True,
        "total": 3,
        "adds": 2,
        "kid": f"{key}/kid" if child else None,
        "last": f"{key}:last",
    }


APPROVAL_TIMINGS = ("early", "completing", "after")
PARKED_S = 3.0  # how long an "after" approval waits parked when the plan evicts (Plan.resident)


def run_chaos(plan: Plan, cluster: Any = None) -> dict[str, Any]:
    """Run the plan on the ``default`` database; returns the figures (violations included). With
    ``plan.audit`` the audit triggers are installed for the run and removed afterwards
    (WEFT_CHAOS_KEEP_AUDIT=1 keeps them and the log, to look at)."""
    if not plan.audit:
        return _run_chaos(plan, cluster)
    audit.install()
    try:
        return _run_chaos(plan, cluster)
    finally:
        if os.environ.get("WEFT_CHAOS_KEEP_AUDIT") != "1":
            _tolerant(audit.uninstall)


def _run_chaos(plan: Plan, cluster: Any = None) -> dict[str, Any]:
    began = time.monotonic()
    run = Run(plan, cluster)
    deadline = began + plan.deadline_s
    specs = []
    for i in range(plan.workflows):
        key = f"{plan.name}-{i}"
        slow, fail, child = i % plan.slow_every == 1, i % plan.fail_every == 2, i % plan.child_every == 0
        specs.append((key, slow, fail, child))
        weft.start("tests.chaos_mixed", id=key, kwargs={"key": key, "slow": slow, "fail": fail, "child": child})
    approvals = []
    for i in range(plan.approvals):
        key, seconds = f"{plan.name}-ap-{i}", 0.2 + 0.15 * (i % 4)
        approvals.append((key, seconds, APPROVAL_TIMINGS[i % len(APPROVAL_TIMINGS)]))
        weft.start("tests.chaos_approve", id=key, kwargs={"key": key, "seconds": seconds})
    chains = [f"{plan.name}-cn-{i}" for i in range(plan.chains)]
    for key in chains:
        weft.start("tests.chaos_chain", id=key, kwargs={"key": key})
    schedule = weft.schedule(
        "tests.scheduled_run", id=SCHEDULE_ID, every=plan.schedule_every, kwargs={"label": "chaos"}
    )
    run.count("activity_slowed_past_timeout", sum(1 for s in specs if s[1]))
    run.count("activity_failing_first_attempt", sum(1 for s in specs if s[2]))
    # Steps to expect: activity, sleep, signal, wait_until, [child], activity.
    expected_steps = sum(6 if child else 5 for *_, child in specs) + sum(1 for *_, child in specs if child)
    expected_steps += 4 * len(approvals)  # activity, update, signal, activity
    expected_steps += 12 * len(chains)  # per run: activity, child, sleep, the child's activity

    def progress() -> float:
        done = _tolerant(lambda: Step.objects.filter(status="completed").count(), 0)
        return done / expected_steps

    phases = {"started": time.monotonic() - began}
    timeline: list[str] = []
    for _ in range(plan.engines):
        run.start_engine()
    client = ThreadPoolExecutor(plan.client_threads, thread_name_prefix="chaos-client")
    futures = [client.submit(run.drive, key, deadline) for key, *_ in specs]
    futures += [client.submit(run.drive_approve, key, s, timing, deadline) for key, s, timing in approvals]
    try:
        for fault in plan.faults:
            while progress() < fault.at and time.monotonic() < deadline:
                time.sleep(0.1)
            injected = time.monotonic() - began
            run.inject(fault)
            timeline.append(f"{injected:.1f}s-{time.monotonic() - began:.1f}s {fault.kind} at {progress():.0%}")
        phases["faults_done"] = time.monotonic() - began
        for future in futures:
            future.result(timeout=max(1.0, deadline - time.monotonic()))

        def mixed_active() -> int:
            return _tolerant(
                lambda: Workflow.objects.filter(status__in=list(ACTIVE_STATUSES), id__startswith=plan.name).count(), 1
            )

        while mixed_active() and time.monotonic() < deadline:
            time.sleep(0.2)
        phases["mixed_done"] = time.monotonic() - began
        _tolerant(lambda: schedule.pause(note="chaos run over"))
        while (
            _tolerant(lambda: Workflow.objects.filter(status__in=list(ACTIVE_STATUSES)).count(), 1)
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        # While the engines still run: no live claim may belong to a dead engine past TTL + grace.
        results: dict[str, Any] = {key: expected_result(key, child) for key, *_, child in specs}
        results.update({key: {"approved": key, "poke": key} for key, *_ in approvals})
        results.update({key: {"io": f"{key}:2", "kid": f"{key}:kid2"} for key in chains})
        exp = Expectations(
            results=results,
            signals=run.signals,
            updates=run.updates,
            dead_engines=set(run.dead),
            grace=timedelta(milliseconds=2 * plan.renew_ms),
            slack=timedelta(seconds=plan.slack_s),
            ttl=timedelta(milliseconds=plan.ttl_ms),
        )
    finally:
        run.stopping.set()
        client.shutdown(wait=True, cancel_futures=True)
        for engine in run.engines:
            engine.stop()
    phases["engines_stopped"] = time.monotonic() - began
    weft_client.close_connections()  # the waiting calls' threads and LISTEN connection
    connections.close_all()
    scheduled = list(Workflow.objects.filter(schedule_id=SCHEDULE_ID).values_list("id", flat=True))
    exp.results.update({wid: {"id": wid, "label": "chaos"} for wid in scheduled})
    exp.results.update({f"{key}/kid": f"{key}/kid" for key, *_, child in specs if child})
    violations = check(exp)
    audit_figures: dict[str, Any] = {}
    if plan.audit:
        lapse = timedelta(milliseconds=plan.ttl_ms + 2 * plan.renew_ms)  # the TTL and the takeover grace
        found, audit_figures = audit.check_audit(run.acked, SEQUENTIAL_TYPES, lapse=lapse)
        violations.update(found)
    phases["checked"] = time.monotonic() - began
    violations["no claim held by a dead engine"] += run.liveness_violations
    violations["client calls answered as promised"] = run.client_errors
    logs = "".join(e.output() for e in run.engines)
    calls = ActivityCall.objects.filter(name="chaos_io").values_list("key", flat=True)
    runs_per_attempt: dict[str, int] = {}
    for key in calls:
        runs_per_attempt[key] = runs_per_attempt.get(key, 0) + 1
    return {
        "variant": plan.name,
        "seconds": round(time.monotonic() - began, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "phases_s": {name: round(at, 1) for name, at in phases.items()},
        "fault_timeline": timeline,
        "engines_started": len(run.engines),
        "workflows": {
            "mixed": plan.workflows,
            "approvals": len(approvals),
            "continue_as_new_chains": len(chains),
            "children": sum(1 for *_, child in specs if child),
            "scheduled_runs": len(scheduled),
            "total": len(exp.results),
        },
        "steps": Step.objects.count(),
        "faults": dict(sorted(run.faults.items())),
        "faults_total": sum(run.faults.values()),
        "observed": {
            "takeovers_logged": logs.count("took over workflow="),
            "deposed_logged": logs.count("stopped driving workflow="),
            "fenced_commits_refused_logged": logs.count("fenced commit refused"),
            "database_errors_logged": logs.count("database error in tick"),
            "signals_acknowledged": len(run.signals),
            "updates_acknowledged": len(run.updates),
            "client_calls_retried": run.client_retries,
            "activity_attempts_run_more_than_once": sum(1 for n in runs_per_attempt.values() if n > 1),
            "activity_calls": len(calls),
            **run.notes,
        },
        "audit": audit_figures,
        "messages_acknowledged": dict(Counter(a.kind for a in run.acked)),
        "violations": {name: found for name, found in violations.items()},
        "violations_total": sum(len(found) for found in violations.values()),
    }


def report(figures: dict[str, Any]) -> str:
    """Print the figures and write them to /tmp; returns the file's path."""
    path = f"/tmp/weft-chaos-{figures['variant']}-{os.getpid()}.json"
    with open(path, "w") as handle:
        json.dump(figures, handle, indent=2, default=str)
    short = {k: v for k, v in figures.items() if k != "violations"}
    short["violations"] = {name: len(found) for name, found in figures["violations"].items()}
    print(f"\nchaos figures ({path}):\n{json.dumps(short, indent=2)}")
    return path
