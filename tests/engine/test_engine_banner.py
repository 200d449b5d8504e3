"""weft_engine prints a start-up banner and, at -v 2, a periodic one-line status."""

from __future__ import annotations

import os
import re

import pytest
from django.db import connection

import weft_django as weft
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.subprocess
def test_banner_and_status_line(weft_engines):
    engine = weft_engines("banner-1", "-v", "2", "--status-interval", "0.3", "--concurrency", "3")
    handle = weft.start("tests.sum", args=[5, 6], id="banner-sum")
    assert handle.result(timeout=30) == {"total": 11}
    output = wait_for(
        lambda: (text := engine.output()) and re.search(r"status engine=banner-1 .*steps=\+[1-9]", text) and text,
        timeout=20,
        message="a status line that reports the committed steps",
    )
    assert engine.stop() == 0
    assert f"weft_engine {weft.__version__}" in output
    assert re.search(rf"engine\s+banner-1 \(host \S+, pid {engine.pid}\)", output), output
    assert re.search(r"ownership\s+workflow-lease: claim ttl=30s renew=5s", output), output
    assert re.search(r"concurrency\s+3 activity threads", output), output
    assert re.search(
        rf"database\s+{connection.vendor} \S*{re.escape(os.path.basename(str(connection.settings_dict['NAME'])))}",
        output,
    ), output
    assert re.search(r"workflows\s+[1-9]\d* registered type\(s\)", output), output
    line = re.search(r"status engine=banner-1 .*", output)
    assert line is not None
    for key in ("claims=", "activities=", "steps=+", "failed=+", "timers_due=", "lag="):
        assert key in line.group(0), line.group(0)


@pytest.mark.subprocess
def test_quiet_engines_print_no_status_line(weft_engines):
    engine = weft_engines("banner-2", "-v", "1", "--status-interval", "0.2", "--once")
    assert engine.wait(30) == 0
    output = engine.output()
    assert "weft_engine" in output and "status engine=" not in output


@pytest.mark.parametrize(
    "args", [["--metrics-port", "70000"], ["--metrics-port", "web"], ["--status-interval", "0"]], ids=str
)
def test_bad_observability_arguments(args):
    from django.core.management import CommandError, call_command

    with pytest.raises((CommandError, SystemExit)):
        call_command("weft_engine", *args)


@pytest.mark.subprocess
def test_a_running_engine_freezes_its_start_up_objects(weft_engines):
    """The long-running engine moves its start-up objects out of the cyclic collector's reach
    (weft_engine.freeze_startup_objects), so full collections no longer walk Django and the app
    registry in the middle of its passes; and takes its thread switch interval from the settings."""
    engine = weft_engines("gc-freeze-1", "-v", "3")
    output = wait_for(
        lambda: (
            (text := engine.output()) and re.search(r"start-up objects frozen engine=gc-freeze-1 objects=(\d+)", text)
        ),
        timeout=20,
        message="the engine's log line for its frozen start-up objects",
    )
    assert int(output.group(1)) > 10_000, output.group(0)
    # WEFT["ENGINE_SWITCH_INTERVAL"] (default 1 ms), set beside the freeze (weft_engine.set_switch_interval)
    assert re.search(r"thread switch interval engine=gc-freeze-1 seconds=0\.001\b", engine.output()), engine.output()
    assert engine.stop() == 0
