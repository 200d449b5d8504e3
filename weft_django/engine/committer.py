"""CommitThread: the engine's fenced commit run on a thread and connection of its own while the loop
does something else beside it (``WEFT["CLAIM_AHEAD"]``: the next batch of a backlog is claimed, loaded
and run while this pass's commit is in flight).

One commit at a time, and the loop waits for it before the pass ends: nothing of the engine's state
is touched by this thread (it runs the store's statements and nothing else), and the pass looks at
the commit's result exactly where it would have looked at a commit it made itself. What the loop does
beside the commit must not depend on it (engine.py: only workflows not in the commit are claimed and
run). A commit that raises hands its exception to the loop, as if raised there; its connection is
closed then, so the next commit starts on a fresh one. The thread's sessions carry the engine's
bounds (``store.sessions.bind``), as the loop's do.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import TypeVar

from django.db import DatabaseError, connections

from ..store import sessions as store_sessions

R = TypeVar("R")


class CommitThread:
    """Runs one job (a fenced commit) beside the loop.

    Args:
        using: the connection alias the commits use.
        session_limit: the engine's session bound (idle in transaction, lock wait), as the loop's.
        name: the thread's name (the engine id is in it, for py-spy and thread dumps).
    """

    def __init__(self, using: str, session_limit: timedelta, name: str) -> None:
        self.using, self.session_limit, self.name = using, session_limit, name
        self._pool: ThreadPoolExecutor | None = None
        self.overlapped = 0  # commits that ran beside the loop (a figure for tests and benchmarks)

    def run(self, job: Callable[[], R], beside: Callable[[], None]) -> R:
        """Run ``job`` on the commit thread while ``beside`` runs on the caller's; return ``job``'s
        result once both are done (its exception raised here). ``beside`` must catch its own
        exceptions: the commit's result is always handled first.

        Args:
            job: the commit (it may use only its own thread's connection).
            beside: what the loop does meanwhile.
        """
        future: Future[R] = self._executor().submit(self._guarded, job)
        try:
            beside()
        finally:
            result = future.result()  # never abandoned: the pass ends after its commit
        self.overlapped += 1
        return result

    def close(self) -> None:
        """Stop the thread and close its connection (the engine's shutdown). Idempotent."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.submit(self._close_connection).result()
            pool.shutdown(wait=True)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=self.name, initializer=self._bind)
        return self._pool

    def _bind(self) -> None:
        store_sessions.bind(self.using, self.session_limit)

    def _guarded(self, job: Callable[[], R]) -> R:
        try:
            return job()
        except DatabaseError:  # a statement failed: the next commit starts on a fresh connection
            connections[self.using].close()
            raise

    def _close_connection(self) -> None:
        connections[self.using].close()


__all__ = ["CommitThread"]
