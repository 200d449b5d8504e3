"""A process an activity forks without exec (multiprocessing's "fork" start method, Linux's default
before Python 3.14) and then terminates: its SIGTERM is its own. The engine's signal handling
(weft_engine's on_signals: handlers that do nothing, the signal number written to a pipe by
``signal.set_wakeup_fd``) was inherited by the child, so the child ignored the SIGTERM and the engine
read it as its own and drained (a second forced its exit). Real engine subprocess, real fork."""

from __future__ import annotations

import signal
import time

import pytest

import weft_django as weft

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def test_a_sigterm_to_a_process_an_activity_forked_is_not_the_engines(weft_engines):
    engine = weft_engines("forked-child")
    handle = weft.start("tests.fork_and_terminate", args=[30], id="forked-child-run")
    code = handle.result(timeout=60)
    time.sleep(1)  # an engine that took the signal for its own is draining by now
    assert (code, "draining" in engine.output()) == (-signal.SIGTERM, False), engine.output()[-2000:]
    assert engine.process.poll() is None, "the engine stopped"
    assert weft.start("tests.sum", args=[2, 3]).result(timeout=30) == {"total": 5}  # it still drives workflows
