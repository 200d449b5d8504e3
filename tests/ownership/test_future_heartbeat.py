"""An engine row whose heartbeat is in the future (a hand edit, a damaged or copied row: PostgreSQL
``'infinity'``, a timestamp a year ahead; on SQLite text that is a future date, or ``'infinity'``, which
compares above every date) is no evidence of life. Before, it counted as a live engine for ever: the
dormant claims of that dead engine (ADR 0014: kept by its holder's heartbeat) were never taken over, so
its workflows were stranded by one bad row; ``weft_engine --reset-ownership-mode`` refused ("still
heartbeat"); ``weft doctor``, ``weft engines`` and the admin showed it alive; its store lease
(``OWNERSHIP="lease"``) was never taken.

The rule (``store/liveness.py``): a heartbeat is evidence of life only within the tolerance either side
of the database clock, ``now - ttl <= heartbeat_at <= now + ttl``. A live engine rewrites its heartbeat
on every renewal, so a damaged row of a live engine heals itself; one slightly ahead of a reader's
clock reading (written after it) is within the tolerance, never read as dead.
"""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

import weft_django as weft
from weft_django.engine import ownership, renewal
from weft_django.models import Engine, OwnershipMarker, WorkflowClaim
from weft_django.store import engines, queues
from weft_django.store.claims import has_lapsed
from weft_django.store.clock import db_clock
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES = connection.vendor == "postgresql"
TTL, RENEW = timedelta(seconds=30), timedelta(seconds=5)  # the defaults the in-process engine runs with
GRACE = RENEW * ownership.TAKEOVER_GRACE_MULTIPLIER
# The stored heartbeats that are no evidence of life, per database (SQLite keeps any text: 'infinity'
# compares above every date there, as a future date does).
AHEAD = {
    "infinity": "'infinity'",
    "a year": "now() + interval '365 days'" if POSTGRES else "strftime('%Y-%m-%d %H:%M:%f', 'now', '+365 days')",
}


def _sql(statement: str, params: list[object] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _heartbeat(engine_id: str, value: str) -> None:
    _sql(f"UPDATE {Engine._meta.db_table} SET heartbeat_at = {value} WHERE id = %s", [engine_id])


def _dormant(engine_id: str, workflow: str = "tests.sum", **start: object) -> tuple[str, int]:
    """A run held by ``engine_id`` (registered, then stopped heartbeating: no process) with a dormant
    claim (renewed with the long TTL, as an engine renews the claims of its evicted workflows)."""
    handle = weft.start(workflow, **start)
    engines.register_engine(engine_id, "workflow-lease", "default")
    got = ownership.acquire(engine_id, limit=1, ttl=TTL, renew_interval=RENEW, using="default")
    epoch = got[handle.id][0]
    assert ownership.renew(engine_id, {handle.id: epoch}, TTL * renewal.DORMANT_TTL_MULTIPLIER, "default") == set()
    assert WorkflowClaim.objects.get(pk=handle.id).expires_at > db_clock("default") + TTL * 2
    return handle.id, epoch


def _doctor() -> dict[str, dict[str, object]]:
    out = StringIO()
    with contextlib.suppress(CommandError):  # unhealthy: a report all the same
        call_command("weft", "doctor", "--json", stdout=out, stderr=StringIO())
    return {check["check"]: check for check in json.loads(out.getvalue())["checks"]}


def _states() -> dict[str, str]:
    out = StringIO()
    call_command("weft", "engines", "--json", stdout=out, stderr=StringIO())
    return {row["id"]: row["state"] for row in json.loads(out.getvalue())}


@pytest.mark.parametrize("ahead", ["infinity", "a year"])
def test_a_dead_engines_dormant_claims_are_taken_over_whatever_its_heartbeat_says(caplog, ahead):
    """Before: nothing took the claim (its holder "heartbeats" for ever, its expiry is ten TTLs out):
    the run did not complete (``ResultTimeoutError``)."""
    caplog.set_level(logging.WARNING, logger="weft_django")
    wid, _ = _dormant("fh-dead", args=[1, 2], id="fh-stranded")
    _heartbeat("fh-dead", AHEAD[ahead])
    good = weft.start("tests.sum", args=[2, 3], id="fh-good")
    run_until_idle(timeout=20)
    assert good.result(timeout=5) == {"total": 5}
    assert weft.get_handle(wid).result(timeout=5) == {"total": 3}
    assert "took over workflow=fh-stranded" in caplog.text and "previous=fh-dead" in caplog.text, caplog.text


@pytest.mark.parametrize("ahead", ["infinity", "a year"])
def test_both_takeover_scans_and_the_lapse_rule_read_such_a_heartbeat_as_silent(ahead):
    """The frequent scan reads only silent engines' claims: the engine must be among them."""
    wid, epoch = _dormant("fh-dead")
    kept, _ = _dormant("fh-alive")
    _heartbeat("fh-dead", AHEAD[ahead])
    assert engines.silent_engines(within=TTL, using="default") == ["fh-dead"]
    assert engines.other_live_engines("me", within=TTL, using="default") == ["fh-alive"]
    taken = ownership.acquire(
        "fh-rescuer", limit=10, ttl=TTL, renew_interval=RENEW, using="default", takeover=True, holders=["fh-dead"]
    )
    assert set(taken) == {wid} and taken[wid][0] > epoch and taken[wid][1] == "fh-dead"
    assert WorkflowClaim.objects.get(pk=kept).engine_id == "fh-alive"
    now = db_clock("default")
    assert has_lapsed(now + TTL * 5, now + timedelta(days=365), now, TTL)


def _dead_engine_ahead(ahead: str) -> None:
    ownership.check_mode_marker("earlier", "workflow-lease", "default")
    _dormant("fh-dead")
    _heartbeat("fh-dead", AHEAD[ahead])


@pytest.mark.parametrize("ahead", ["infinity", "a year"])
def test_reset_ownership_mode_does_not_count_it_alive(ahead):
    """Before: CommandError "1 engine(s) still heartbeat (fh-dead)": a dead engine's row, for ever."""
    _dead_engine_ahead(ahead)
    call_command("weft_engine", "--reset-ownership-mode", stdout=StringIO())
    assert not OwnershipMarker.objects.exists()


@pytest.mark.parametrize("ahead", ["infinity", "a year"])
def test_the_doctor_reports_it_dead_and_its_claims_lapsed(ahead):
    """Before: "an engine is alive", no dead engine, no lapsed claim."""
    _dead_engine_ahead(ahead)
    report = _doctor()
    assert report["engines"]["level"] == "error", report["engines"]  # a run is running, no engine alive
    dead = report["dead engines"]
    assert dead["level"] in ("warning", "error") and any("fh-dead" in d for d in dead["details"]), dead  # type: ignore[attr-defined]
    if ahead == "a year":  # readable: its age said as what it is, not "365 d ago"
        assert any("ahead of the database clock" in d for d in dead["details"]), dead  # type: ignore[attr-defined]
    assert report["lapsed claims"]["level"] == "error", report["lapsed claims"]


@pytest.mark.parametrize("ahead", ["infinity", "a year"])
def test_weft_engines_and_the_queues_do_not_count_it_alive(ahead):
    """Before: ``weft engines`` said "alive", and it counted as serving every queue."""
    _dead_engine_ahead(ahead)
    assert _states() == {"fh-dead": "dead"}
    assert queues.served_queues(within=TTL, using="default") == {}


@pytest.mark.parametrize("ahead", [timedelta(0), timedelta(seconds=2), TTL - timedelta(seconds=1)])
def test_a_live_engines_heartbeat_now_or_slightly_ahead_is_never_read_as_dead(ahead):
    """Within the tolerance (a heartbeat written just after a reader's clock reading, a clock a little
    ahead): alive everywhere, and its dormant claims kept."""
    ownership.check_mode_marker("earlier", "workflow-lease", "default")
    wid, _ = _dormant("fh-live")
    Engine.objects.filter(pk="fh-live").update(heartbeat_at=db_clock("default") + ahead)
    assert engines.silent_engines(within=TTL, using="default") == []
    assert engines.other_live_engines("me", within=TTL, using="default") == ["fh-live"]
    for holders in (None, ["fh-live"]):
        taken = ownership.acquire(
            "fh-rescuer", limit=10, ttl=TTL, renew_interval=RENEW, using="default", takeover=True, holders=holders
        )
        assert taken == {}
    assert WorkflowClaim.objects.get(pk=wid).engine_id == "fh-live"
    now = db_clock("default")
    assert not has_lapsed(now + TTL * 5, now + ahead, now, TTL)
    assert _states() == {"fh-live": "alive"}
    report = _doctor()
    assert report["dead engines"]["level"] == "ok" and report["lapsed claims"]["level"] == "ok", report
    assert report["engines"]["level"] == "ok", report["engines"]
    with pytest.raises(CommandError, match=r"1 engine\(s\) still heartbeat \(fh-live\)"):
        call_command("weft_engine", "--reset-ownership-mode")
    assert OwnershipMarker.objects.exists()


LEASE = {"OWNERSHIP": "lease", "LEASE_TTL": "3s", "LEASE_RENEW_INTERVAL": "1s", "LEASE_WAIT_TIMEOUT": "6s"}


@pytest.mark.parametrize("ahead", ["infinity", "a year"])
def test_a_store_lease_of_a_dead_engine_whose_heartbeat_is_ahead_is_taken(ahead):
    """OWNERSHIP="lease": the lease's expiry far ahead (a hand edit) and its holder's heartbeat ahead too.
    Before: every engine waited for the lease and exited (EngineLeaseAcquisitionTimeoutError), for ever."""
    with override_settings(WEFT=LEASE):
        run_until_idle(timeout=15)  # the mode marker and the lease row
        engines.register_engine("fh-dead", "lease", "default")
        _heartbeat("fh-dead", AHEAD[ahead])
        _sql(f"UPDATE weft_django_storelease SET engine_id = 'fh-dead', expires_at = {AHEAD[ahead]}")
        good = weft.start("tests.sum", args=[2, 3], id="fh-good")
        run_until_idle(timeout=15)
        assert good.result(timeout=5) == {"total": 5}
