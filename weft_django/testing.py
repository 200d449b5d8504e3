"""Test kit: run engines in process or as subprocesses on the test database, move workflow time, and
freeze an engine past its claims to check that its late writes are refused. See docs/testing.md.

Loaded as a pytest plugin (entry point ``weft_django``), so a project that installs weft-django gets
the fixtures ``weft_run_until_idle``, ``weft_engine``, ``weft_clock`` and ``weft_engines``. They request
``transactional_db`` (engines use their own connections, so they only see committed rows).

``python -m weft_django.testing --database-name NAME [--weft JSON] -- <weft_engine args>`` is how
engine subprocesses are started against the test database (the settings module is the caller's;
``--weft`` overrides keys of ``settings.WEFT`` in that process only).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

logger = logging.getLogger(__name__)

try:
    import pytest
except ImportError:  # pragma: no cover - the kit's functions work without pytest
    pytest = None  # type: ignore[assignment]


def run_until_idle(timeout: float = 30.0, **engine_options: Any) -> None:
    """Drive every runnable workflow in this process until nothing is runnable now.

    Workflows waiting for a signal, a future timer or an update stay parked; their claims are
    released when this returns, so the next call (or a real engine) picks them up again.
    """
    from .engine.engine import Engine

    Engine(engine_options.pop("engine_id", "test-in-process"), **engine_options).run_until_idle(timeout)


@contextmanager
def running_engine(engine_id: str = "test-background", **engine_options: Any) -> Iterator[Any]:
    """Run an engine in a thread of this process for the duration of the ``with`` block (what blocking
    calls need: ``handle.update()``, ``handle.query()``, ``handle.result()`` while it works). Yields the
    ``Engine``; on exit it drains and releases its claims like a SIGTERM'd ``weft_engine``."""
    import threading

    from django.db import connections

    from .engine.engine import Engine

    engine = Engine(engine_id, **engine_options)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            engine.run()
        except BaseException as exc:  # re-raised in the test's thread on exit
            failure.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True, name=f"weft-engine-{engine_id}")
    thread.start()
    try:
        yield engine
    finally:
        engine.request_stop()
        thread.join(timeout=30)
        if thread.is_alive():
            raise RuntimeError(f"engine {engine_id!r} did not stop within 30s after the test")
        if failure:
            raise failure[0]


def owns(engine: Any, workflow_id: str, timeout: float = 30.0) -> None:
    """Wait until the in-process ``engine`` (from ``running_engine``) drives ``workflow_id``."""
    wait_for(lambda: workflow_id in engine.owned, timeout, message=f"{engine.engine_id} to own {workflow_id}")


class Clock:
    """Workflow time for every process of the test: timers and deadlines come due when you advance it.
    Claims keep using the raw database clock, so skipping time does not expire them."""

    def advance(self, seconds: float | timedelta) -> None:
        from .store.clock import advance

        advance(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))

    def set_offset(self, seconds: float | timedelta) -> None:
        from .store.clock import set_offset

        set_offset(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))

    def advance_to(self, when: datetime) -> None:
        """Move workflow time forward to ``when`` (an aware datetime); never backwards."""
        delta = when - self.now()
        if delta > timedelta(0):
            self.advance(delta)

    def offset(self) -> timedelta:
        from .store.clock import offset

        return offset()

    def now(self) -> datetime:
        """Workflow time: the database clock plus the offset."""
        from .store.clock import db_now

        return db_now()


class EngineProcess:
    """A real ``weft_engine`` subprocess on the test database. ``weft`` overrides keys of
    ``settings.WEFT`` in that process only (e.g. a short ``WORKFLOW_CLAIM_TTL`` for failover tests)."""

    def __init__(
        self,
        engine_id: str,
        args: list[str],
        env: dict[str, str] | None = None,
        log_path: str | None = None,
        weft: Mapping[str, Any] | None = None,
    ):
        from django.conf import settings
        from django.db import connections

        from .conf import database_alias

        alias = database_alias()
        name = str(connections[alias].settings_dict["NAME"])
        self.engine_id = engine_id
        self.alias = alias
        self.weft = dict(weft or {})
        self.log_path = log_path or f"/tmp/weft-engine-{engine_id}-{os.getpid()}.log"
        command = [
            sys.executable,
            "-m",
            "weft_django.testing",
            "--database-alias",
            alias,
            "--database-name",
            name,
            "--weft",
            json.dumps(self.weft),
            "--",
            "--engine-id",
            engine_id,
            *args,
        ]
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", settings.SETTINGS_MODULE),
            # Names the engine's PostgreSQL sessions, so a test can find (and terminate) them.
            "PGAPPNAME": f"weft-{engine_id}"[:63],
            **(env or {}),
        }
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(command, env=environment, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def terminate(self) -> None:
        self.send(signal.SIGTERM)

    def kill(self) -> None:
        self.send(signal.SIGKILL)

    def freeze(self) -> None:
        self.send(signal.SIGSTOP)

    def thaw(self) -> None:
        self.send(signal.SIGCONT)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is not None:
                self._log.close()

    def stop(self, timeout: float = 30.0) -> int:
        self.thaw()
        self.terminate()
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.wait(timeout)

    def output(self) -> str:
        with open(self.log_path) as handle:
            return handle.read()

    def claims(self) -> dict[str, int]:
        """The claims this engine holds now: {workflow id: epoch}."""
        from .store.claims import held_claims

        return held_claims(self.engine_id, self.alias)

    def claim_timing(self) -> tuple[timedelta, timedelta]:
        """(claim TTL, takeover grace) as this engine sees them: its ``weft`` overrides, else this
        process's settings. Another engine may take a claim over once it expired more than the grace ago."""
        from django.conf import settings

        from .conf import DEFAULTS
        from .durations import to_timedelta
        from .store.claims import takeover_grace

        merged = {**DEFAULTS, **getattr(settings, "WEFT", {}), **self.weft}
        ttl = to_timedelta(merged["WORKFLOW_CLAIM_TTL"], "WORKFLOW_CLAIM_TTL")
        renew = to_timedelta(merged["WORKFLOW_CLAIM_RENEW_INTERVAL"], "WORKFLOW_CLAIM_RENEW_INTERVAL")
        return ttl, takeover_grace(renew)

    def _settle_in_flight_statements(self, timeout: float = 30.0) -> None:
        """After SIGSTOP, a statement (a COMMIT) the engine sent just before may still be running on the
        server: wait until none of its sessions is active, so the step snapshot taken next includes it."""
        from .store.backend import backend

        store = backend(self.alias)
        if not store.skips_locked:  # one writer for the whole database (SQLite)
            self._freeze_outside_a_write(timeout)
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if store.busy_sessions(f"weft-{self.engine_id}"[:63]) == 0:
                return
            time.sleep(0.02)
        logger.warning("engine %r still had a statement running %.0f s after SIGSTOP", self.engine_id, timeout)

    def _freeze_outside_a_write(self, timeout: float) -> None:
        """SQLite has one write lock for the whole file: an engine frozen while it holds it would stop
        every other engine (no takeover could ever be written). Thaw and freeze again until it is
        stopped outside a write transaction."""
        from .store.backend import backend

        deadline = time.monotonic() + timeout
        while True:
            if backend(self.alias).write_lock_free(raise_busy=time.monotonic() > deadline):
                return
            self.thaw()
            time.sleep(0.05)
            self.freeze()

    def freeze_past_claim(self, *, timeout: float = 120.0, expire: bool = False) -> FrozenEngine:
        """SIGSTOP the engine and return once every claim it held can be taken over: after their expiry
        plus the takeover grace on the database clock (or its heartbeat plus the TTL and the grace), or
        at once with ``expire=True`` (the claims' expiry is moved into the past, so the test does not
        wait a TTL). Start or keep another engine running to take them over, then ``thaw()`` and
        ``assert_writes_refused()`` on the result.

        The engine must hold at least one claim (wait for it to pick the workflow up first)."""
        self.freeze()
        self._settle_in_flight_statements()
        claims = self.claims()
        if not claims:
            self.thaw()
            raise RuntimeError(
                f"engine {self.engine_id!r} holds no claim to freeze past: wait until it picks the workflow up "
                "first, e.g. wait_for(lambda: proc.claims())"
            )
        frozen = FrozenEngine(self, claims, _step_snapshot(claims, self.alias))
        if expire:
            expire_claims(self.engine_id, using=self.alias)
        else:
            frozen.wait_until_claims_lapse(timeout)
        return frozen


_REFUSAL = re.compile(
    r"(?:fenced commit refused|stopped driving|late activity result discarded) workflow=(?P<workflow>\S+)"
)


def _step_snapshot(claims: Mapping[str, int], using: str) -> dict[int, tuple[Any, ...]]:
    from .models import Step

    rows = Step.objects.using(using).filter(workflow_id__in=list(claims))
    return {row[0]: row[1:] for row in rows.values_list("pk", "epoch", "status", "attempts", "completed_at", "result")}


@dataclass
class FrozenEngine:
    """An engine stopped with SIGSTOP, and the claims it held then ({workflow id: epoch})."""

    engine: EngineProcess
    claims: dict[str, int]
    steps_at_freeze: dict[int, tuple[Any, ...]] = field(repr=False)
    thawed: bool = False
    thawed_at: datetime | None = None

    def wait_until_claims_lapse(self, timeout: float = 120.0) -> None:
        """Wait on the database clock until every frozen claim lapsed: it expired more than the grace ago,
        or the engine's last heartbeat is more than the TTL and the grace old (a dormant claim, ADR 0014:
        store/claims/holding.py takes either)."""
        from .models import Engine, WorkflowClaim
        from .store.clock import db_clock
        from .store.liveness import is_live

        ttl, grace = self.engine.claim_timing()

        def lapsed() -> bool:
            now = db_clock(self.engine.alias)
            beat = (
                Engine.objects.using(self.engine.alias)
                .filter(id=self.engine.engine_id)
                .values_list("heartbeat_at", flat=True)
            )
            if beat and not is_live(beat[0], now, ttl + grace):
                return True
            rows = WorkflowClaim.objects.using(self.engine.alias).filter(workflow_id__in=list(self.claims))
            expiries = [
                e for wid, ep, e in rows.values_list("workflow_id", "epoch", "expires_at") if ep == self.claims[wid]
            ]
            latest = max((e for e in expiries if e is not None), default=None)
            return latest is None or latest + grace < now

        wait_for(
            lapsed, timeout, interval=0.1, message=f"the claims of frozen engine {self.engine.engine_id!r} to lapse"
        )

    def wait_for_takeover(self, timeout: float = 60.0) -> dict[str, str | None]:
        """Wait until no frozen claim is at its frozen epoch any more (another engine took it over, or
        a transition rotated it); return {workflow id: the engine that took it over}.

        That is the claim's holder now or, if there is none, its ``last_engine_id``: the engine that
        last took the claim, which a release does not clear. So a rescuer that took the claim over and
        already ran the workflow to its end (the terminal commit releases the claim) is still reported,
        however late this is called. None when no engine took the claim after the freeze: the epoch
        moved by a transition from outside (cancel, terminate, suspend...), which sets no holder and
        leaves ``last_engine_id`` naming the frozen engine itself, or the claim is gone (purged). If an
        engine took the claim and a transition rotated it afterwards, that engine is still reported.
        Call it before ``thaw()``: a thawed engine may take its workflows back.

        A frozen engine that was mid-commit still holds its row locks, and takeover skips locked rows:
        that shows up here as a timeout."""
        from .models import WorkflowClaim

        frozen_id = self.engine.engine_id

        def taken_by(holder: str | None, last: str | None) -> str | None:
            if holder is not None:
                return holder
            return None if last == frozen_id else last

        def moved() -> dict[str, str | None] | None:
            rows = WorkflowClaim.objects.using(self.engine.alias).filter(workflow_id__in=list(self.claims))
            current = {
                wid: (epoch, taken_by(holder, last))
                for wid, epoch, holder, last in rows.values_list("workflow_id", "epoch", "engine_id", "last_engine_id")
            }
            if any(current.get(wid, (None, None))[0] == epoch for wid, epoch in self.claims.items()):
                return None
            return {wid: current.get(wid, (None, None))[1] for wid in self.claims}

        result: dict[str, str | None] = wait_for(moved, timeout, message="another engine to take the frozen claims")
        return result

    def thaw(self) -> None:
        """SIGCONT: the engine resumes where it stopped, still believing it owns its old claims."""
        from .store.clock import db_clock

        self.thawed_at = db_clock(self.engine.alias)
        self.engine.thaw()
        self.thawed = True

    def refusals(self) -> set[str]:
        """Workflows the thawed engine reported refused or dropped (its log, at WARNING)."""
        return {m.group("workflow") for m in _REFUSAL.finditer(self.engine.output())}

    def late_writes(self) -> list[Any]:
        """Steps written or changed under a frozen epoch since the freeze: empty when fencing held."""
        from .models import Step

        rows = Step.objects.using(self.engine.alias).filter(workflow_id__in=list(self.claims))
        late = []
        for step in rows.order_by("workflow_id", "seq"):
            if step.epoch != self.claims[step.workflow_id]:
                continue
            row = (step.epoch, step.status, step.attempts, step.completed_at, step.result)
            if self.steps_at_freeze.get(step.pk) != row:
                late.append(step)
        return late

    def assert_writes_refused(self, timeout: float = 30.0, *, stop: bool = True) -> set[str]:
        """Thaw (if not yet), wait until the engine has run its claim renewal again (its heartbeat moved
        past the thaw: it has now seen that it lost the claims), then, with ``stop``, stop it gracefully
        so every in-flight activity ends and every commit it still wanted to make has been tried. Assert
        that nothing was committed under a frozen epoch; return ``refusals()`` for further checks."""
        from .models import Engine

        if not self.thawed:
            self.thaw()
        thawed_at = self.thawed_at

        # Two heartbeats after the thaw: the renewal runs before the heartbeat, and one frozen inside its
        # statement may report "nothing lost" from before the freeze; the next one has seen the loss.
        beats: list[datetime] = []

        def ran_again() -> bool:
            if self.engine.process.poll() is not None:
                return True
            beat = (
                Engine.objects.using(self.engine.alias)
                .filter(pk=self.engine.engine_id)
                .values_list("heartbeat_at", flat=True)
                .first()
            )
            if beat is not None and thawed_at is not None and beat > thawed_at and beat not in beats:
                beats.append(beat)
            return len(beats) >= 2

        wait_for(ran_again, timeout, message=f"thawed engine {self.engine.engine_id!r} to renew its claims again")
        if stop:
            self.engine.stop(timeout)
        late = self.late_writes()
        assert not late, f"steps committed under a frozen epoch after the freeze: {late}"
        return self.refusals()


def expire_claims(
    engine_id: str | None = None, *, workflow_ids: list[str] | None = None, using: str | None = None
) -> int:
    """Move claims' expiry far into the past, so the next takeover scan of any engine takes them
    (no waiting for a TTL). Selects an engine's claims, or given workflows' (held ones only)."""
    from .conf import database_alias
    from .store import claims

    return claims.expire_claims(engine_id, workflow_ids, using or database_alias())


class EngineFactory:
    def __init__(self) -> None:
        self.started: list[EngineProcess] = []

    def __call__(
        self,
        engine_id: str | None = None,
        *args: str,
        env: dict[str, str] | None = None,
        weft: Mapping[str, Any] | None = None,
    ) -> EngineProcess:
        process = EngineProcess(engine_id or f"test-engine-{len(self.started) + 1}", list(args), env, weft=weft)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            if process.process.poll() is None:
                process.stop()


def replay(history: Any, workflow: Any) -> Any:
    """Check in a unit test that ``workflow`` (the current code) replays a stored history: what
    ``manage.py weft export ID`` wrote (a file's path, its JSON text or the dict). Runs no activity
    and writes nothing. Returns the outcome (``.frontier``: the step the replay stopped at).

    Args:
        history: the exported history.
        workflow: a @weft.workflow function, its definition or name, or a plain generator function.

    Raises:
        NonDeterminismError: the code yields another operation where the history recorded one, or
            ends differently from the recorded run (the other failures: docs/deploys.md).
        InvalidArgumentError: ``history`` is not an exported history.
    """
    from .engine.replayer import check

    return check(history, workflow)


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05, message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


if pytest is not None:

    @pytest.fixture
    def weft_run_until_idle(transactional_db: None) -> Any:
        """``weft_run_until_idle()`` drives runnable workflows in process until idle."""
        return run_until_idle

    @pytest.fixture
    def weft_engine(transactional_db: None) -> Iterator[Any]:
        """An engine running in a thread of this process for the whole test (``running_engine()``)."""
        with running_engine("test-background") as engine:
            yield engine

    @pytest.fixture
    def weft_clock(transactional_db: None) -> Iterator[Clock]:
        clock = Clock()
        yield clock
        clock.set_offset(0)

    @pytest.fixture
    def weft_engines(transactional_db: None) -> Iterator[EngineFactory]:
        """``proc = weft_engines("engine-a", "--concurrency", "4")`` starts a real engine subprocess."""
        factory = EngineFactory()
        try:
            yield factory
        finally:
            factory.stop_all()


def _main() -> None:
    parser = argparse.ArgumentParser(description="Run weft_engine against a test database.")
    parser.add_argument("--database-alias", default="default")
    parser.add_argument("--database-name", required=True)
    parser.add_argument("--weft", default="{}", help="JSON object: keys of settings.WEFT to override.")
    parser.add_argument("engine_args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    import django
    from django.conf import settings

    settings.DATABASES[options.database_alias]["NAME"] = options.database_name
    overrides = json.loads(options.weft)
    if overrides:
        settings.WEFT = {**getattr(settings, "WEFT", {}), **overrides}
    django.setup()
    from django.core.management import call_command

    engine_args = [a for a in options.engine_args if a != "--"]
    call_command("weft_engine", *engine_args)


if __name__ == "__main__":
    _main()
