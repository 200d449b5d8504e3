"""Driving an in-process engine pass by pass in tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from weft_django.engine.engine import Engine


def tick_until(engine: Engine, condition: Callable[[], Any], message: str, timeout: float = 30) -> None:
    """Tick ``engine`` until ``condition()`` holds; AssertionError naming ``message`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        engine.tick()
        time.sleep(0.01)
