"""scripts/demo's last step, ``python manage.py weft_demo``, on a fresh SQLite file (issue 20): one command
that shows a crash and the resume, a durable timer and a signal, with engines named for the demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.sqlite, pytest.mark.subprocess, pytest.mark.timeout(240)]


def test_the_demo_shows_a_crash_a_resume_a_timer_and_a_signal(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "WEFT_"))}
    env["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    env["PYTHONPATH"] = str(ROOT)

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=200
        )

    assert manage("migrate", "--no-input").returncode == 0
    done = manage("weft_demo")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "test-in-process" not in output
    assert "demo-engine-1" in output and "demo-engine-2" in output
    assert "SIGKILL" in output  # the crash
    assert "took over workflow=" in output  # the second engine's own log line
    assert 'signal("approve"' in output
    assert "durable timer" in output
    assert "charge_card ran once" in output  # resumed from its last step, not from the start
    assert '"approved_by": "alice"' in output
    assert "Status: completed" in output
