"""``weft_engine --reset-ownership-mode``: clear the ownership-mode marker, refused while an engine is
alive, in a bounded time whatever holds the marker's row.

The reset locks the marker's row (weft_django_ownershipmarker id=1) before it looks for live engines, as
an engine's start-up does before it checks its mode. A user's open transaction holding that row (a
``SELECT ... FOR UPDATE`` left open in psql, a shell, the admin) made the command wait without bound:
its session has no lock_timeout. Now each attempt waits COMMIT_LOCK_WAIT_MS (100 ms) for the row and
lets go, as the engine's start-up does for its own row, and the attempts go on for ``LOCK_WAIT``
(long enough for an engine's start-up, which holds the row for a moment); then the command fails with a
CommandError naming the row, having changed nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from django.core.management.base import CommandError
from django.db import OperationalError

from ..store.engines import RowHeld, reset_mode_marker, reset_mode_marker_unless_alive
from ..store.sessions import write_lock_busy

LOCK_WAIT = 5.0  # seconds of attempts before the command gives up on a held marker row
RETRY_EVERY = 0.2  # seconds between two attempts (each waits 100 ms for the row)


def reset_ownership_mode(
    using: str, *, within: timedelta, force: bool, say: Callable[[str], object] | None = None
) -> None:
    """Delete the ownership-mode marker; unless ``force``, only when no engine is alive.

    Args:
        using: the connection alias.
        within: the claim TTL (an engine is alive while its heartbeat is within it, store/liveness.py).
        force: delete it whatever engines look alive.
        say: a callable given one line when the first attempt finds the row held (the command's stderr).

    Raises:
        CommandError: an engine is alive (and not ``force``); or the marker's row stayed locked by
            another transaction for ``LOCK_WAIT`` seconds; or (SQLite) the database's write lock stayed
            held past the busy timeout. Nothing was changed in either case.
    """
    deadline, told = time.monotonic() + LOCK_WAIT, False
    while True:
        try:
            if force:
                reset_mode_marker(using)
                return
            alive = reset_mode_marker_unless_alive(within=within, using=using)
            break
        except RowHeld as exc:
            if time.monotonic() >= deadline:
                raise CommandError(_held(exc.table, exc.key)) from None
            if say is not None and not told:
                say(
                    f"The ownership mode marker (row id={exc.key!r} of {exc.table}) is locked by another "
                    f"transaction; trying again for up to {LOCK_WAIT:g} s."
                )
                told = True
            time.sleep(RETRY_EVERY)
        except OperationalError as exc:
            if not write_lock_busy(exc):  # SQLite's one write lock, held past the busy timeout
                raise
            raise CommandError(
                "The database is locked by another connection's transaction (SQLite's one write lock, held past "
                "the busy timeout): nothing was changed. End that transaction (commit or roll it back), then "
                "run --reset-ownership-mode again."
            ) from None
    if alive:
        raise CommandError(
            f"{len(alive)} engine(s) still heartbeat ({', '.join(sorted(alive)[:5])}): stop every engine "
            "before resetting the ownership mode (or pass --force if they are gone)."
        )


def _held(table: str, key: object) -> str:
    return (
        f"The ownership mode marker (row id={key!r} of {table}) stayed locked by another transaction for "
        f"{LOCK_WAIT:g} s: nothing was changed. End the transaction that holds it (commit or roll it back: "
        "an open transaction in psql, a shell or the admin, e.g. after SELECT ... FOR UPDATE on that row; "
        "pg_stat_activity shows it 'idle in transaction'), then run --reset-ownership-mode again."
    )
