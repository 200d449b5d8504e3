"""``weft_engine --reset-ownership-mode`` while another transaction holds the ownership-mode marker's row
(weft_django_ownershipmarker id=1: a ``SELECT ... FOR UPDATE`` left open in psql, a shell, the admin).
The reset locks that row before it looks for live engines; its session has no lock_timeout, so it
waited for as long as the row was held: without bound, saying nothing.

Now each attempt waits 100 ms for the row and lets go (as the engine's start-up does for its own row),
the attempts go on for ``management/mode_reset.LOCK_WAIT`` seconds (5) (an engine's start-up holds the row only for a
moment), then the command fails with a CommandError naming the row, having changed nothing; once the
transaction ends, it succeeds."""

from __future__ import annotations

import sqlite3
import threading
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections

from tests.engine.locked import Held, row_lock
from weft_django.engine import ownership
from weft_django.models import OwnershipMarker

pytestmark = pytest.mark.django_db(transaction=True)
LOCK_WAIT = 5.0  # weft_django/management/mode_reset.LOCK_WAIT (docs/operations.md)
BOUND = LOCK_WAIT + 10  # what the command may take at most, its lock wait included


def _reset_in_a_thread(*args: str) -> tuple[threading.Thread, dict[str, object]]:
    """Run the reset on a thread of its own (its own connection); the outcome and the time it took."""
    outcome: dict[str, object] = {}

    def run() -> None:
        began, err = time.monotonic(), StringIO()
        try:
            call_command("weft_engine", "--reset-ownership-mode", *args, stdout=StringIO(), stderr=err)
            outcome["result"] = "cleared"
        except BaseException as exc:
            outcome["result"] = exc
        finally:
            outcome["took"], outcome["stderr"] = time.monotonic() - began, err.getvalue()
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.postgres
@pytest.mark.parametrize("force", [False, True])
def test_a_reset_while_a_transaction_holds_the_marker_ends_with_a_clear_error_then_succeeds(force):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    ownership.check_mode_marker("earlier", "workflow-lease", "default")
    args = ["--force"] if force else []
    with Held(*row_lock("ownershipmarker", "id", 1), hold_at_most=BOUND + 30) as held:
        thread, outcome = _reset_in_a_thread(*args)
        thread.join(BOUND)
        assert not thread.is_alive(), f"the reset still waits for the marker row after {BOUND} s"  # before: for ever
        error = outcome["result"]
        assert isinstance(error, CommandError), outcome
        assert "row id=1 of weft_django_ownershipmarker" in str(error) and "nothing was changed" in str(error)
        assert "End the transaction that holds it" in str(error), str(error)
        assert LOCK_WAIT - 1 <= outcome["took"] <= BOUND, outcome  # type: ignore[operator]
        assert "is locked by another transaction; trying again" in str(outcome["stderr"]), outcome
        assert OwnershipMarker.objects.get().mode == "workflow-lease"  # nothing changed
        assert not held.released.is_set()
    call_command("weft_engine", "--reset-ownership-mode", *args, stdout=StringIO())
    assert not OwnershipMarker.objects.exists()


@pytest.mark.postgres
def test_a_reset_goes_through_once_the_transaction_ends_within_its_wait():
    """The row let go a second into the wait (an engine's start-up, a short transaction): cleared."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    ownership.check_mode_marker("earlier", "workflow-lease", "default")
    with Held(*row_lock("ownershipmarker", "id", 1), hold_at_most=BOUND + 30) as held:
        thread, outcome = _reset_in_a_thread()
        time.sleep(1)
        held.let_go()
        thread.join(BOUND)
    assert not thread.is_alive() and outcome["result"] == "cleared", outcome
    assert not OwnershipMarker.objects.exists()


@pytest.mark.sqlite
def test_a_reset_while_another_connection_holds_sqlites_write_lock_says_so():
    """SQLite: the wait is the busy timeout's; past it the command said only the driver's
    ``OperationalError: database is locked``."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's one write lock")
    ownership.check_mode_marker("earlier", "workflow-lease", "default")
    options = connection.settings_dict["OPTIONS"]
    timeout = options.get("timeout")
    options["timeout"] = 0.5  # the busy timeout of the command's next connection
    connection.close()
    holder = sqlite3.connect(str(connection.settings_dict["NAME"]), isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(CommandError, match="database is locked by another connection's transaction"):
            call_command("weft_engine", "--reset-ownership-mode", stdout=StringIO(), stderr=StringIO())
        holder.execute("ROLLBACK")
    finally:
        holder.close()
        if timeout is None:
            options.pop("timeout")
        else:
            options["timeout"] = timeout
        connection.close()
    assert OwnershipMarker.objects.get().mode == "workflow-lease"
    call_command("weft_engine", "--reset-ownership-mode", stdout=StringIO())
    assert not OwnershipMarker.objects.exists()
