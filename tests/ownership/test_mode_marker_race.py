"""Two engines of different OWNERSHIP modes starting at once on an empty database (PostgreSQL:
threads on their own connections, released together by a barrier). The one-row mode marker is
created once: one engine records its mode, the other reads it and, its mode being another, is
refused with OwnershipModeMismatchError (no IntegrityError, no second marker, no deadlock)."""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.races import alternate, race
from weft_django.engine.ownership import check_mode_marker
from weft_django.models import OwnershipMarker
from weft_django.store.engines import reset_mode_marker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_engines_of_different_modes_starting_at_once_record_one_mode():
    winners = set()
    for round_ in range(10):
        reset_mode_marker("default")
        outcomes = race(
            lambda: check_mode_marker("engine-lease", "lease", "default"),
            lambda: check_mode_marker("engine-none", "none", "default"),
            delays=alternate(round_, 0.01),
        )
        marker = OwnershipMarker.objects.get()
        refused = [o for o in outcomes if o is not None]
        assert len(refused) == 1 and isinstance(refused[0], weft.OwnershipModeMismatchError), outcomes
        assert outcomes[("lease", "none").index(marker.mode)] is None  # the recorded mode's engine runs
        assert marker.set_by == f"engine-{marker.mode}"
        winners.add(marker.mode)
    print("recorded modes:", sorted(winners))


def test_a_mode_reset_racing_an_engines_start_never_leaves_it_running_without_its_mode(monkeypatch):
    """``weft_engine --reset-ownership-mode`` refuses while an engine heartbeats, then deletes the
    marker. An engine starting between that look and the delete (its mode checked against the marker,
    then its row registered) ran with no marker: the next engine recorded any mode it had, and two
    fencing modes shared the database. The look and the delete must not let a start in between."""
    import threading
    import time

    from django.core.management import CommandError, call_command
    from django.db import connection, connections

    from weft_django.engine import ownership
    from weft_django.engine.engine import Engine
    from weft_django.store import engines

    engine = Engine("mode-race-engine")
    check_mode_marker("an-earlier-engine", engine.mode, "default")  # the database runs under its mode
    go, started = threading.Event(), threading.Event()
    table = OwnershipMarker._meta.db_table
    real, main = engines.other_live_engines, threading.get_ident()

    def looked_then_an_engine_starts(engine_id, *, within, using):
        found = real(engine_id, within=within, using=using)
        if threading.get_ident() == main:
            go.set()  # the engine starts between the reset's look and its delete
            for _ in range(3000):  # until it started, or waits for a lock the reset holds
                if started.is_set() or _waits_for_a_lock_on(table, connection):
                    break
                time.sleep(0.01)
        return found

    monkeypatch.setattr(engines, "other_live_engines", looked_then_an_engine_starts)
    outcome: list[object] = []

    def start() -> None:
        try:
            go.wait(30)
            outcome.append(ownership.start_up(engine, engine.settings))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            started.set()
            connections.close_all()

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    try:
        call_command("weft_engine", "--reset-ownership-mode")
        reset = True
    except CommandError:
        reset = False  # refused: the engine was seen alive
    thread.join(60)
    assert outcome == [True], outcome
    marker = OwnershipMarker.objects.filter(id=1).values_list("mode", "set_by").first()
    # The engine runs: the marker must say its mode, whether the reset came before it (it recorded its
    # mode again) or saw it alive (refused).
    assert marker is not None and marker[0] == engine.mode, (reset, marker)


def _waits_for_a_lock_on(table: str, connection) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # read inside the reset's transaction: a fresh look
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            [f"%{table}%"],
        )
        return bool(cursor.fetchone()[0])
