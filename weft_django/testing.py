"""Test kit: run engines in process or as subprocesses on the test database, and move workflow time.

Loaded as a pytest plugin (entry point ``weft_django``), so a project that installs weft-django gets
the fixtures ``weft_run_until_idle``, ``weft_clock`` and ``weft_engines``. Use them with
``transactional_db`` (engines use their own connections, so they only see committed rows).

``python -m weft_django.testing --database-name NAME -- <weft_engine args>`` is how engine
subprocesses are started against the test database (the settings module is the caller's).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

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


class Clock:
    """Workflow time for every process of the test: timers and deadlines come due when you advance it.
    Claims keep using the raw database clock, so skipping time does not expire them."""

    def advance(self, seconds: float | timedelta) -> None:
        from .clock import advance

        advance(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))

    def set_offset(self, seconds: float | timedelta) -> None:
        from .clock import set_offset

        set_offset(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))

    def now(self) -> Any:
        from .clock import db_now

        return db_now()


class EngineProcess:
    """A real ``weft_engine`` subprocess on the test database."""

    def __init__(self, engine_id: str, args: list[str], env: dict[str, str] | None = None, log_path: str | None = None):
        from django.conf import settings
        from django.db import connections

        from .conf import database_alias

        alias = database_alias()
        name = str(connections[alias].settings_dict["NAME"])
        self.engine_id = engine_id
        self.log_path = log_path or f"/tmp/weft-engine-{engine_id}-{os.getpid()}.log"
        command = [
            sys.executable,
            "-m",
            "weft_django.testing",
            "--database-alias",
            alias,
            "--database-name",
            name,
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


class EngineFactory:
    def __init__(self) -> None:
        self.started: list[EngineProcess] = []

    def __call__(self, engine_id: str | None = None, *args: str, env: dict[str, str] | None = None) -> EngineProcess:
        process = EngineProcess(engine_id or f"test-engine-{len(self.started) + 1}", list(args), env)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            if process.process.poll() is None:
                process.stop()


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
    parser.add_argument("engine_args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    import django
    from django.conf import settings

    settings.DATABASES[options.database_alias]["NAME"] = options.database_name
    django.setup()
    from django.core.management import call_command

    engine_args = [a for a in options.engine_args if a != "--"]
    call_command("weft_engine", *engine_args)


if __name__ == "__main__":
    _main()
