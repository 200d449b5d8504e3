"""Racing calls for the concurrency tests: each call on a thread of its own (its own database
connection), all released together by a barrier, so that they meet on the same rows.

``race(*calls)`` returns each call's value or the exception it raised, in the order of the calls;
``delays`` (seconds, one per call) holds some calls back after the barrier, so that a test can make
each side come first in some rounds (which side wins is then checked, not assumed). A
call still running after ``JOIN_SECONDS`` is a hang (a deadlock the database did not break, a lock
wait without end): the race fails with AssertionError naming it. Nothing is timed otherwise.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

JOIN_SECONDS = 120.0


def race(*calls: Callable[[], Any], delays: tuple[float, ...] | None = None) -> list[Any]:
    """Run ``calls`` at once, one thread (and connection) each; their values or exceptions."""
    holds = delays or (0.0,) * len(calls)
    barrier = threading.Barrier(len(calls))
    outcomes: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            if holds[index]:
                time.sleep(holds[index])
            outcomes[index] = call()
        except BaseException as exc:  # returned to the test, which says which ones are allowed
            outcomes[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call), daemon=True) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    hung = [i for i, thread in enumerate(threads) if thread.is_alive()]
    assert not hung, f"racing calls {hung} never returned (a deadlock or an endless lock wait)"
    return outcomes


def errors(outcomes: list[Any]) -> list[BaseException]:
    """The exceptions among ``outcomes``."""
    return [outcome for outcome in outcomes if isinstance(outcome, BaseException)]


def alternate(round_: int, seconds: float = 0.03) -> tuple[float, float]:
    """Delays for two racing calls: the first held back in odd rounds, the second in every fourth."""
    return (seconds, 0.0) if round_ % 2 else ((0.0, seconds) if round_ % 4 == 2 else (0.0, 0.0))
