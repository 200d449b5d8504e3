"""``weft_engine --processes N``: N engine processes under one command, for the cores one Python
loop cannot use.

The command validates the settings and the migrations once, closes its database connections and
forks N children (the app registry and the workflow modules are loaded once, before the fork). Each
child is an ordinary engine with its own id and its own claims: engines share work across processes
exactly as they do across machines (ownership, fencing, takeover: docs/reliability.md).

The parent only supervises:

- **Stopping.** SIGTERM or SIGINT to the parent asks every child to drain (finish or hand back its
  activities, release its claims) and exits once they have; a second signal makes them exit at once
  (FORCE, then SIGKILL: a stopped or frozen child never reads its pipe). A child forked as the
  signal arrives is told too; one that dies while draining is logged.
  The children do not act on the terminal's or the service manager's signals themselves beyond a
  drain: a Ctrl-C, or systemd's SIGTERM to the whole control group, reaches them together with the
  parent's word and must not count twice (a second signal would force an exit).
- **The parent's death.** Each child reads a pipe from the parent; end of file (the parent died,
  even by SIGKILL) makes it drain and exit, so no engine outlives its supervisor.
- **A child that dies** is started again (a fresh engine id when ids were given: the dead one's
  claims are taken over like any silent engine's), after a back-off that grows while it keeps dying
  within ``QUICK_EXIT`` seconds; after ``MAX_QUICK_EXITS`` such deaths in a row the parent stops the
  others and exits 1 (a child that cannot start, e.g. an ownership-mode mismatch, is reported, not
  restarted forever).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

logger = logging.getLogger("weft_django.engine.processes")

QUICK_EXIT = 10.0  # seconds: a child that dies sooner than this after its start counts as failing to start
MAX_QUICK_EXITS = 3  # such deaths in a row of one child: give up
MAX_BACKOFF = 30.0  # seconds between restarts of a child that keeps dying
STOP, FORCE = b"s", b"f"  # what the parent writes to a child's pipe
# PostgreSQL: an engine's loop, its claim renewal, its LISTEN connection and its commit thread's (a
# backlog's commit runs beside the next claim, WEFT["CLAIM_AHEAD"])
CONNECTIONS_PER_ENGINE = 4


def connection_shortfall(processes: int, alias: str) -> str | None:
    """Why ``processes`` engines cannot all connect to the database ``alias``: a server whose
    connections for non-superusers (PostgreSQL's ``max_connections`` less its reserved ones) are
    fewer than CONNECTIONS_PER_ENGINE per engine. None when they fit (on SQLite: always). Each activity
    thread that queries adds one more connection, and other clients hold some: fitting is necessary,
    not sufficient."""
    from ..store.backend import backend

    available = backend(alias).connection_capacity()
    if available is None:
        return None
    needed = processes * CONNECTIONS_PER_ENGINE
    if needed <= available:
        return None
    return (
        f"--processes {processes} needs at least {needed} database connections ({CONNECTIONS_PER_ENGINE} per "
        f"engine: its loop, claim renewal and LISTEN) and PostgreSQL's max_connections leaves {available}: "
        f"run at most {available // CONNECTIONS_PER_ENGINE} processes, or raise max_connections."
    )


@dataclasses.dataclass(frozen=True)
class Child:
    """What a forked child runs as: its engine id (None: the engine's default), its metrics port
    (None: none), and the read end of its pipe from the parent."""

    slot: int
    engine_id: str | None
    metrics_port: int | None
    control_fd: int

    def watch(self, request_stop: Any) -> None:
        """Start the thread that follows the parent's word: drain (``request_stop()``) on STOP or when
        the parent is gone (end of file), exit at once on FORCE."""

        def follow() -> None:
            with os.fdopen(self.control_fd, "rb", buffering=0) as pipe:
                while True:
                    data = pipe.read(16)
                    if FORCE in data:
                        sys.stderr.write("weft_engine: forced exit (the supervisor's second signal)\n")
                        os._exit(1)
                    if not data or STOP in data:
                        request_stop()
                        if not data:
                            return

        threading.Thread(target=follow, name="weft-supervisor-pipe", daemon=True).start()


def child_engine_id(base: str | None, slot: int, restarts: int) -> str | None:
    """Child ``slot``'s engine id: ``<base>-<slot>``, then ``<base>-<slot>.<restarts>`` once restarted
    (a new id: the dead process's claims are another engine's); None without a base."""
    if base is None:
        return None
    return f"{base}-{slot}" if restarts == 0 else f"{base}-{slot}.{restarts}"


def child_metrics_port(port: int | None, slot: int) -> int | None:
    """Child ``slot``'s metrics port: ``port + slot - 1`` (0 stays 0: each picks a free one)."""
    if port is None or port == 0:
        return port
    return port + slot - 1


@dataclasses.dataclass
class _Slot:
    slot: int
    pid: int = 0
    pipe: int = -1
    started: float = 0.0
    restarts: int = 0
    quick_exits: int = 0


class Supervisor:
    """The parent of ``weft_engine --processes N`` (see the module docstring).

    Args:
        processes: how many engine processes (>= 2).
        engine_id: the ``--engine-id`` given (children get ``<id>-1`` ...), or None.
        metrics_port: the ``--metrics-port`` given (children get consecutive ports), or None.
    """

    def __init__(self, processes: int, engine_id: str | None, metrics_port: int | None) -> None:
        self.processes = processes
        self.engine_id = engine_id
        self.metrics_port = metrics_port
        self.slots = {i: _Slot(i) for i in range(1, processes + 1)}
        self.signals = 0
        self.failed = False
        self.pid = os.getpid()  # the supervisor's: its signal handler does nothing in a child

    def run(self) -> Child:
        """Fork the children and supervise them. Returns only in a child (what it runs as); the
        parent exits the process when its children have stopped (status 0, or 1 after a forced stop
        or a child that could not start)."""
        from django.db import connections

        connections.close_all()  # no connection may be shared with a child
        # Before the first fork: a stop asked while the children are forked is a drain, told to each.
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for slot in self.slots.values():
            child = self._spawn(slot)
            if child is not None:
                return child
        started = [str(s.pid) for s in self.slots.values() if s.pid]  # all, unless a stop came first
        logger.warning("weft_engine: %d engine processes started (pids %s)", len(started), ", ".join(started))
        child = self._supervise()
        if child is not None:
            return child
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if self.failed or self.signals > 1 else 0)

    def _spawn(self, slot: _Slot) -> Child | None:
        """Fork child ``slot``: returns its Child in the child, None in the parent (also when a stop
        was asked: no child is forked then)."""
        if self.signals or self.failed:
            return None
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(write_end)
            for other in self.slots.values():  # a sibling's pipe held open here would hide the parent's death
                if other.pipe >= 0:
                    os.close(other.pipe)
            os.setpgrp()  # the terminal's Ctrl-C goes to the parent, which tells each child once
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            engine_id = child_engine_id(self.engine_id, slot.slot, slot.restarts)
            return Child(slot.slot, engine_id, child_metrics_port(self.metrics_port, slot.slot), read_end)
        os.close(read_end)
        slot.pid, slot.pipe, slot.started = pid, write_end, time.monotonic()
        if self.signals:  # the stop's handler ran between the fork and the line above: it missed this child
            self._stop(slot)
        return None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:  # a child between its fork and its own handlers: the parent tells it
            return
        self.signals += 1
        if self.signals == 1:
            logger.warning("weft_engine: draining %d engine processes (send it again to force exit)", self.processes)
        for slot in self.slots.values():
            self._stop(slot)

    def _stop(self, slot: _Slot) -> None:
        """Tell child ``slot`` what the signals so far ask: drain after the first, exit at once after more."""
        word = STOP if self.signals == 1 else FORCE
        self._tell(slot, word)
        if word == FORCE and slot.pid:  # a child that cannot read its pipe (stopped, frozen) exits too
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.pid, signal.SIGKILL)

    def _tell(self, slot: _Slot, word: bytes) -> None:
        if slot.pipe >= 0:
            with contextlib.suppress(OSError):  # the child is gone already
                os.write(slot.pipe, word)

    def _supervise(self) -> Child | None:
        """Wait for children; restart those that die while no stop was asked. Returns a Child in a
        restarted child, None in the parent once every child has stopped."""
        while any(s.pid for s in self.slots.values()):
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            slot = next((s for s in self.slots.values() if s.pid == pid), None)
            if slot is None:
                continue
            os.close(slot.pipe)
            slot.pid, slot.pipe = 0, -1
            code = os.waitstatus_to_exitcode(status)
            if self.signals or self.failed:
                if code != 0 and self.signals < 2:  # not the forced stop's doing: its claims were not released
                    logger.warning(
                        "weft_engine: engine process %d (pid %d) exited with status %d while stopping",
                        slot.slot,
                        pid,
                        code,
                    )
                continue
            lived = time.monotonic() - slot.started
            slot.quick_exits = slot.quick_exits + 1 if lived < QUICK_EXIT else 0
            if slot.quick_exits >= MAX_QUICK_EXITS:
                logger.error(
                    "weft_engine: engine process %d exited %d times within %gs of its start (last status %d): "
                    "stopping the others",
                    slot.slot,
                    slot.quick_exits,
                    QUICK_EXIT,
                    code,
                )
                self.failed = True
                for other in self.slots.values():
                    self._tell(other, STOP)
                continue
            delay = min(MAX_BACKOFF, 2.0**slot.quick_exits - 1.0)
            logger.warning(
                "weft_engine: engine process %d (pid %d) exited with status %d; starting it again in %gs",
                slot.slot,
                pid,
                code,
                delay,
            )
            if self._sleep(delay):
                continue
            slot.restarts += 1
            child = self._spawn(slot)
            if child is not None:
                return child
        return None

    def _sleep(self, seconds: float) -> bool:
        """Sleep, cut short by a stop; whether a stop was asked."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.signals:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return bool(self.signals)
