"""What a new user stumbles on (issue 20): each mistake gets a message that says what to do."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

import weft_django as weft
from tests.testapp.workflows import add
from weft_django import events
from weft_django.operations import RunActivity, Sleep

ROOT = Path(__file__).resolve().parents[2]


def _script_without_the_app(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings_without_app", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.sqlite
def test_start_without_the_app_in_installed_apps_says_what_to_add() -> None:
    done = _script_without_the_app("import weft_django as weft\nweft.start('anything')")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "ImproperlyConfigured" in last or "ConfigurationError" in last, done.stderr
    assert 'Add "weft_django" to INSTALLED_APPS' in done.stderr
    assert "doesn't declare an explicit app_label" not in last


@pytest.mark.sqlite
def test_importing_the_client_directly_without_the_app_says_what_to_add() -> None:
    done = _script_without_the_app("from weft_django.client import start")
    assert done.returncode != 0
    assert 'Add "weft_django" to INSTALLED_APPS' in done.stderr, done.stderr


@pytest.mark.sqlite
def test_the_start_shortcut_without_the_app_says_what_to_add() -> None:
    code = "import weft_django as weft\n@weft.workflow(name='x')\ndef x(ctx):\n    yield from ()\nx.start()"
    done = _script_without_the_app(code)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "ImproperlyConfigured" in last or "ConfigurationError" in last, done.stderr
    assert 'Add "weft_django" to INSTALLED_APPS' in done.stderr, done.stderr


def test_an_operation_used_as_its_result_says_to_yield_it() -> None:
    op = RunActivity(add, "{}")
    with pytest.raises(TypeError, match=r"result = yield ctx\.run\("):
        op["reservation"]
    with pytest.raises(AttributeError, match="yield"):
        op.charge_id  # noqa: B018
    with pytest.raises(TypeError, match="yield"):
        list(Sleep(timedelta(seconds=1)))
    with pytest.raises(TypeError, match="yield"):
        "x" in Sleep(timedelta(seconds=1))  # noqa: B015
    assert op.name == add.name  # real attributes still work


@pytest.mark.django_db(transaction=True)
def test_forgetting_yield_fails_the_run_with_the_hint(weft_run_until_idle) -> None:
    handle = weft.start("tests.new_user.no_yield", args=[1])
    weft_run_until_idle()
    with pytest.raises(weft.WorkflowFailedError, match=r"yield ctx\.run"):
        handle.result(timeout=5)


@weft.workflow(name="tests.new_user.no_yield")
def no_yield(ctx: weft.WorkflowContext, order_id: int):  # type: ignore[no-untyped-def]
    yield ctx.sleep("1ms")
    reservation = ctx.run(add, order_id, 1)  # the mistake: no yield
    return reservation["total"]


def test_an_async_workflow_is_told_to_be_a_generator() -> None:
    async def checkout(ctx: weft.WorkflowContext) -> None:
        await ctx.run(add, 1, 2)  # type: ignore[misc]

    with pytest.raises(weft.WorkflowDefinitionError) as caught:
        weft.workflow(checkout)
    message = str(caught.value)
    assert "async def" in message and "has no `yield`" not in message
    assert "result = yield ctx.run(" in message and "await" in message


def test_an_async_generator_workflow_is_told_the_same() -> None:
    async def checkout(ctx: weft.WorkflowContext):  # type: ignore[no-untyped-def]
        yield ctx.run(add, 1, 2)

    with pytest.raises(weft.WorkflowDefinitionError, match="async def"):
        weft.workflow(checkout)


def test_a_plain_function_workflow_still_hears_about_yield() -> None:
    def checkout(ctx: weft.WorkflowContext) -> int:
        return 1

    with pytest.raises(weft.WorkflowDefinitionError, match="has no `yield`"):
        weft.workflow(checkout)


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_is_logged_at_warning_with_its_error(weft_run_until_idle, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="weft_django")
    handle = weft.start("tests.fails")
    before = events.stats("test-in-process").snapshot()
    weft_run_until_idle(engine_id="test-in-process")
    with pytest.raises(weft.WorkflowFailedError):
        handle.result(timeout=5)
    lines = [r for r in caplog.records if r.name == "weft_django.engine.workflows"]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    record = lines[0]
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert f"workflow failed workflow={handle.id}" in text
    assert "type=tests.fails" in text
    assert "error=RuntimeError: workflow code broke" in text
    after = events.stats("test-in-process").snapshot()
    assert after.workflows_failed - before.workflows_failed == 1
    assert after.workflows_finished - before.workflows_finished == 1


@pytest.mark.django_db(transaction=True)
def test_the_status_line_counts_a_failed_run_as_failed(weft_run_until_idle) -> None:
    from weft_django.engine.engine import Engine
    from weft_django.management.commands.weft_engine import StatusReporter

    reporter = StatusReporter(Engine("status-failed"), 30.0)
    weft.start("tests.fails")
    weft_run_until_idle(engine_id="status-failed")
    line = reporter.line()
    assert " finished=+1 " in line and " failed=+1 " in line, line
    assert " steps_failed=+0 " in line, line
