"""Claims under real concurrency (PostgreSQL): threads with their own connections race the claim
operations on the same rows.

(a) renewal vs takeover of an expired claim: exactly one wins, never both;
(b) release vs a late fenced commit: a commit after the release is refused; a commit in flight
    blocks the release until it is done;
(c) N engines racing acquire (and takeover) on the same runnable workflows: each is claimed once;
(d) cancel vs a fenced commit: the commit lands before the cancel (which then sees it) or is
    refused; nothing is written under the old epoch after the cancel's rotation.
"""

from __future__ import annotations

import collections
import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections

import weft_django as weft
from weft_django import transitions
from weft_django.engine import fencing, ownership
from weft_django.engine.driver import StepRecord
from weft_django.models import BufferedSignal, Step, Timer, Workflow, WorkflowClaim
from weft_django.store import commit as store_commit
from weft_django.store.clock import db_clock, db_now

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

USING = "default"
TTL = timedelta(seconds=30)
RENEW = timedelta(seconds=5)
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)
CLAIM_UPDATE = "UPDATE weft_django_workflowclaim"
RELEASE = "SET LOCAL lock_timeout = '100ms';\nWITH mine"


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks and SKIP LOCKED races are a PostgreSQL matter")


# -- helpers --------------------------------------------------------------------------------------


# For a test that must see both orders: its first two rounds give one side, then the other, a head
# start far longer than the race window (random jitter alone can favour one side on a loaded machine).
HEAD_START = {0: [0.0, 0.25], 1: [0.25, 0.0]}


def race(
    *calls: Callable[[], Any],
    jitter: float = 0.004,
    rng: random.Random | None = None,
    delays: list[float] | None = None,
) -> list[Any]:
    """Run each call on its own thread and connection, released together by a barrier (after each
    thread has connected), with a little random delay to vary the interleaving (or the ``delays``
    given). Returns the results; re-raises the first error."""
    rng = rng or random.Random()
    delays = delays or [rng.uniform(0, jitter) for _ in calls]
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            connections[USING].ensure_connection()
            barrier.wait(30)
            time.sleep(delays[index])
            results[index] = call()
        except BaseException as exc:
            errors[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call), daemon=True) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a racing thread hung"
    for error in errors:
        if error is not None:
            raise error
    return results


class Background:
    """One call on its own thread and connection; ``done`` is set when it returns."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()
            self.done.set()

    def join(self) -> Any:
        self.thread.join(30)
        assert not self.thread.is_alive(), "background call hung"
        if self.error is not None:
            raise self.error
        return self.result


# How the one-statement commit shows in pg_stat_activity: one query string, prepared.KEYED_PLAN's SETs
# and then the statement (as itself, or as the EXECUTE of its prepared form).
ONE_STATEMENT = ("SET LOCAL enable_seqscan = off;",)


def wait_for_lock_waiter(query_prefix: str | tuple[str, ...], timeout: float = 30.0) -> None:
    """Wait until some backend is blocked on a row lock running a statement that starts so."""
    prefixes = [query_prefix] if isinstance(query_prefix, str) else list(query_prefix)
    matches = " OR ".join(["ltrim(query) LIKE %s"] * len(prefixes))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                f"AND wait_event_type = 'Lock' AND ({matches})",
                [prefix + "%" for prefix in prefixes],
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.01)
    raise AssertionError(f"no backend blocked on a lock running {query_prefix!r}")


@contextlib.contextmanager
def commit_held_before_writes() -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold every fenced commit after its claim rows are locked and before it writes (the test-kit
    "engine held just before its commit"): yields (locked, proceed) events. Forces the general path
    (lock, then write, in one transaction); ``statement_held_at_its_writes`` holds the other one."""
    locked, proceed = threading.Event(), threading.Event()
    original, fits = store_commit._apply, store_commit._fits_one_statement
    store_commit._fits_one_statement = lambda batch, using: False  # type: ignore[assignment]

    def held(*args: Any, **kwargs: Any) -> Any:
        locked.set()
        assert proceed.wait(30), "the test never let the commit proceed"
        return original(*args, **kwargs)

    store_commit._apply = held  # type: ignore[assignment]
    try:
        yield locked, proceed
    finally:
        proceed.set()
        store_commit._apply = original  # type: ignore[assignment]
        store_commit._fits_one_statement = fits  # type: ignore[assignment]


@contextlib.contextmanager
def statement_held_at_its_writes(wid: str, run_id: str, seq: int = 0) -> Iterator[threading.Event]:
    """Hold a one-statement fenced commit (the fence and the writes are one statement: there is no
    Python between them to pause) inside the database, after its fence CTE locked the claim: another
    transaction inserts the step row it will write and stays open, so the commit's upsert waits for
    it. Yields the event that lets it proceed (the blocker rolls back)."""
    proceed = threading.Event()
    ready = threading.Event()

    def blocker() -> None:
        blocking = connections.create_connection(USING)
        try:
            with blocking.cursor() as cursor:
                blocking.set_autocommit(False)
                cursor.execute(
                    "INSERT INTO weft_django_step (workflow_id, run_id, seq, kind, name, status, result, attempts, "
                    "epoch, started_at) VALUES (%s, %s, %s, 'activity', 'blocker', 'running', NULL, 0, 0, now())",
                    [wid, run_id, seq],
                )
                ready.set()
                assert proceed.wait(30), "the test never let the commit proceed"
                blocking.rollback()
        finally:
            blocking.close()

    thread = threading.Thread(target=blocker, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield proceed
    finally:
        proceed.set()
        thread.join(10)


def start_and_claim(wid: str, engine: str = "engine-a") -> tuple[str, int]:
    """Start a run and claim it; return (run id, epoch). Other runnable workflows must be held or ended."""
    weft.start("tests.sum", args=[1, 2], id=wid)
    got = ownership.acquire(engine, limit=10, ttl=TTL, renew_interval=RENEW, using=USING)
    assert set(got) == {wid}, got
    return str(Workflow.objects.get(pk=wid).run_id), got[wid][0]


def expire(wid: str) -> None:
    WorkflowClaim.objects.filter(pk=wid).update(expires_at=LONG_AGO)


def claim_of(wid: str) -> tuple[int, str | None]:
    claim = WorkflowClaim.objects.get(pk=wid)
    return claim.epoch, claim.engine_id


def step_writes(wid: str, run_id: str, epoch: int, seq: int = 0, **extra: Any) -> store_commit.WorkflowWrites:
    return store_commit.WorkflowWrites(
        wid, run_id, epoch, steps=[StepRecord(seq, "activity", "add", "completed", "3", attempts=1)], **extra
    )


def commit(
    engine: str, writes: list[store_commit.WorkflowWrites], now: datetime | None = None
) -> store_commit.FenceResult:
    """A fenced commit as the engine makes it: the fence skips claim rows another transaction holds
    (``busy``, nothing written) and the engine tries those workflows again on a later pass."""
    now = now or db_now(USING)
    result = fencing.fenced_commit(engine, writes, now, USING)
    deadline = time.monotonic() + 30
    while result.busy:
        assert time.monotonic() < deadline, f"rows stayed locked: {result}"
        time.sleep(0.005)
        retry = fencing.fenced_commit(engine, [w for w in writes if w.workflow_id in result.busy], now, USING)
        result = store_commit.FenceResult(
            result.committed | retry.committed,
            {**result.lost, **retry.lost},
            {**result.children, **retry.children},
            retry.busy,
        )
    return result


# -- (a) renewal vs takeover ----------------------------------------------------------------------


def test_renewal_and_takeover_of_an_expired_claim_never_both_win():
    rng = random.Random(20240501)
    outcomes: collections.Counter[str] = collections.Counter()
    for round_ in range(100):
        wid = f"rt-{round_}"
        _, epoch = start_and_claim(wid)
        expire(wid)
        renewed_rows: list[int] = []

        def renewal(wid: str = wid, epoch: int = epoch, renewed_rows: list[int] = renewed_rows) -> set[str]:
            def spy(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
                # The renewal's UPDATE that ran to its end: the plain form, or (when the plain form's
                # wait for the takeover's row lock ran out, so it raised) the form that skips it.
                result = execute(sql, params, many, context)
                if CLAIM_UPDATE in sql and "SET expires_at" in sql:
                    renewed_rows.append(context["cursor"].rowcount)
                return result

            with connection.execute_wrapper(spy):
                return ownership.renew("engine-a", {wid: epoch}, TTL, USING)

        def takeover() -> dict[str, tuple[int, str | None]]:
            return ownership.acquire("engine-b", limit=10, ttl=TTL, renew_interval=RENEW, using=USING, takeover=True)

        lost, taken = race(renewal, takeover, rng=rng, delays=HEAD_START.get(round_))
        assert len(renewed_rows) == 1
        renewed = renewed_rows[0] == 1
        assert renewed != bool(taken), f"round {round_}: renewed={renewed} taken={taken}"  # exactly one wins
        if taken:
            new_epoch, previous = taken[wid]
            assert set(taken) == {wid} and previous == "engine-a" and new_epoch > epoch
            assert claim_of(wid) == (new_epoch, "engine-b")
            # The renewal either saw the loss (its plain UPDATE waited for the takeover's row and found
            # another epoch), or skipped the row the takeover held past its short wait (neither renewed
            # nor lost): then its next tick sees the loss.
            assert lost in ({wid}, set())
            outcomes["takeover, renewal saw the loss" if lost else "takeover, renewal skipped the row"] += 1
            assert ownership.renew("engine-a", {wid: epoch}, TTL, USING) == {wid}
        else:
            assert lost == set()
            assert claim_of(wid) == (epoch, "engine-a")
            assert WorkflowClaim.objects.get(pk=wid).expires_at > db_clock(USING)
            outcomes["renewal"] += 1
        transitions.cancel(wid)
    print("renew vs takeover:", dict(outcomes))
    assert outcomes["renewal"] and sum(outcomes.values()) - outcomes["renewal"], outcomes


# -- (b) release vs a late fenced commit ----------------------------------------------------------


def test_a_commit_after_the_release_is_refused():
    run_id, epoch = start_and_claim("rel-1")
    ownership.release("engine-a", {"rel-1": epoch}, USING)
    result = commit("engine-a", [step_writes("rel-1", run_id, epoch)])
    assert result.committed == set() and result.lost == {"rel-1": "released"}
    assert not Step.objects.filter(workflow_id="rel-1").exists()
    assert claim_of("rel-1") == (epoch, None)


def test_a_commit_in_flight_keeps_its_claim_from_a_release():
    """A release meeting a claim a commit in flight holds waits COMMIT_LOCK_WAIT_MS at most, then leaves
    that claim held (it expires; never cleared under the commit), and the commit lands. (It waited for
    as long as the row was held, and a user's transaction held past lock_timeout rolled back every
    claim of the release: tests/ownership/test_release_past_a_held_row.py.)"""
    run_id, epoch = start_and_claim("rel-2")
    with commit_held_before_writes() as (locked, proceed):
        committing = Background(lambda: commit("engine-a", [step_writes("rel-2", run_id, epoch)]))
        assert locked.wait(10)
        began = time.monotonic()
        ownership.release("engine-a", {"rel-2": epoch}, USING)
        assert time.monotonic() - began < 5
        assert claim_of("rel-2") == (epoch, "engine-a")
        proceed.set()
        result = committing.join()
    assert result.committed == {"rel-2"} and result.lost == {}
    assert list(Step.objects.filter(workflow_id="rel-2").values_list("seq", "epoch")) == [(0, epoch)]
    assert claim_of("rel-2") == (epoch, "engine-a")  # left to expire, epoch kept


def test_a_one_statement_commit_holds_its_fence_until_its_writes_are_done():
    """The one-statement path: its fence CTE locks the claim, then its upsert waits behind another
    transaction; a release meanwhile waits for the claim lock (COMMIT_LOCK_WAIT_MS at most, then
    leaves the claim held), never clearing it under the commit: the commit lands."""
    run_id, epoch = start_and_claim("rel-3")
    writes = step_writes("rel-3", run_id, epoch)
    assert store_commit._fits_one_statement([writes], USING)
    with statement_held_at_its_writes("rel-3", run_id) as proceed:
        committing = Background(lambda: commit("engine-a", [writes]))
        wait_for_lock_waiter(ONE_STATEMENT)  # the upsert waits for the blocker's uncommitted step row
        releasing = Background(lambda: ownership.release("engine-a", {"rel-3": epoch}, USING))
        wait_for_lock_waiter(RELEASE)  # ... and the release waits for the commit's claim lock
        assert claim_of("rel-3") == (epoch, "engine-a")
        proceed.set()
        result = committing.join()
        releasing.join()
    assert result.committed == {"rel-3"} and result.lost == {}
    assert list(Step.objects.filter(workflow_id="rel-3").values_list("seq", "epoch", "name")) == [(0, epoch, "add")]
    assert claim_of("rel-3") in {(epoch, None), (epoch, "engine-a")}  # released after the commit, or left held


def test_a_takeover_waits_for_a_one_statement_commit_and_a_late_one_is_refused():
    run_id, epoch = start_and_claim("tk-1")
    expire("tk-1")
    writes = step_writes("tk-1", run_id, epoch)
    with statement_held_at_its_writes("tk-1", run_id) as proceed:
        committing = Background(lambda: commit("engine-a", [writes]))
        wait_for_lock_waiter(ONE_STATEMENT)
        # The takeover skips the locked row (SKIP LOCKED): nothing to take while the commit is in flight.
        taken = ownership.acquire("engine-b", limit=10, ttl=TTL, renew_interval=RENEW, using=USING, takeover=True)
        assert taken == {}
        proceed.set()
        assert committing.join().committed == {"tk-1"}
    taken = ownership.acquire("engine-b", limit=10, ttl=TTL, renew_interval=RENEW, using=USING, takeover=True)
    assert set(taken) == {"tk-1"}
    late = commit("engine-a", [step_writes("tk-1", run_id, epoch, seq=1)])
    assert late.committed == set() and late.lost == {"tk-1": "deposed"}
    assert list(Step.objects.filter(workflow_id="tk-1").values_list("seq", "epoch")) == [(0, epoch)]


def test_cancel_racing_a_one_statement_commit():
    """Writes the one-statement path takes (a step, a consumed signal, the run's end) raced against
    cancel: either all of them land before the cancel, or none."""
    rng = random.Random(13)
    outcomes: collections.Counter[str] = collections.Counter()
    for round_ in range(60):
        wid = f"cx1-{round_}"
        run_id, epoch = start_and_claim(wid)
        weft.signal(wid, "go", 1)
        signal_pk = BufferedSignal.objects.get(workflow_id=wid).pk
        writes = step_writes(wid, run_id, epoch, signals_consumed=[(signal_pk, 0)])
        writes.finish = store_commit.Finish("completed", result="3")
        assert store_commit._fits_one_statement([writes], USING)
        now = db_now(USING)
        result, cancel = race(
            lambda writes=writes, now=now: commit("engine-a", [writes], now),
            lambda wid=wid: _cancel_or_ended(wid),
            rng=rng,
            jitter=0.02,
            delays=HEAD_START.get(round_),
        )
        status = Workflow.objects.get(pk=wid).status
        steps = list(Step.objects.filter(workflow_id=wid).values_list("epoch", flat=True))
        signal_state = BufferedSignal.objects.get(workflow_id=wid).state
        if result.committed:
            assert cancel is None and status == "completed" and steps == [epoch] and signal_state == "consumed"
            outcomes["commit, then the cancel found it ended"] += 1
        else:
            assert cancel is not None and cancel > epoch and result.lost == {wid: "released"}
            assert status == "cancelled" and steps == [] and signal_state == "dropped"
            outcomes["cancel, then the commit was refused"] += 1
    print("cancel vs one-statement commit:", dict(outcomes))
    assert len(outcomes) == 2, outcomes


def _cancel_or_ended(wid: str) -> int | None:
    try:
        return transitions.cancel(wid, "race")
    except weft.WorkflowTerminalError:
        return None


def test_release_racing_a_fenced_commit():
    rng = random.Random(7)
    outcomes: collections.Counter[str] = collections.Counter()
    for round_ in range(60):
        wid = f"rel-race-{round_}"
        run_id, epoch = start_and_claim(wid)
        writes, now = step_writes(wid, run_id, epoch), db_now(USING)
        result, _ = race(
            lambda writes=writes, now=now: commit("engine-a", [writes], now),
            lambda wid=wid, epoch=epoch: ownership.release("engine-a", {wid: epoch}, USING),
            rng=rng,
        )
        steps = list(Step.objects.filter(workflow_id=wid).values_list("epoch", flat=True))
        if result.committed:
            assert result.committed == {wid} and result.lost == {} and steps == [epoch]
            outcomes["commit then release"] += 1
        else:
            assert result.lost == {wid: "released"} and steps == []
            outcomes["release then refused commit"] += 1
        assert claim_of(wid) == (epoch, None)
        transitions.cancel(wid)
    print("release vs commit:", dict(outcomes))


# -- (c) N engines racing acquire -----------------------------------------------------------------


def _drain(engine: str, takeover: bool) -> dict[str, int]:
    """One engine's claim loop: acquire in small batches until nothing more is free."""
    mine: dict[str, int] = {}
    while True:
        got = ownership.acquire(engine, limit=7, ttl=TTL, renew_interval=RENEW, using=USING, takeover=takeover)
        if not got:
            return mine
        assert not set(got) & set(mine)
        mine.update({wid: epoch for wid, (epoch, _) in got.items()})


def _assert_each_claimed_once(wids: list[str], claims: list[dict[str, int]], engines: list[str]) -> None:
    winners: dict[str, list[str]] = collections.defaultdict(list)
    for engine, mine in zip(engines, claims, strict=True):
        for wid in mine:
            winners[wid].append(engine)
    assert sorted(winners) == sorted(wids), "every workflow is claimed"
    assert all(len(engines) == 1 for engines in winners.values()), {w: e for w, e in winners.items() if len(e) > 1}
    rows = {c.workflow_id: (c.epoch, c.engine_id) for c in WorkflowClaim.objects.filter(pk__in=wids)}
    for engine, mine in zip(engines, claims, strict=True):
        for wid, epoch in mine.items():
            assert rows[wid] == (epoch, engine)


def test_engines_racing_acquire_claim_each_workflow_exactly_once():
    wids = [f"many-{i:02d}" for i in range(50)]
    for wid in wids:
        weft.start("tests.sum", args=[1, 2], id=wid)
    engines = [f"engine-{i}" for i in range(8)]
    before = dict(WorkflowClaim.objects.filter(pk__in=wids).values_list("workflow_id", "epoch"))
    claims = race(*[lambda engine=engine: _drain(engine, False) for engine in engines])
    _assert_each_claimed_once(wids, claims, engines)
    assert all(epoch > before[wid] for mine in claims for wid, epoch in mine.items())
    assert ownership.acquire("late", limit=100, ttl=TTL, renew_interval=RENEW, using=USING) == {}
    print("acquired per engine:", [len(mine) for mine in claims])

    # Every holder stalls past TTL + grace: the engines race the takeover the same way.
    WorkflowClaim.objects.filter(pk__in=wids).update(expires_at=LONG_AGO)
    held = {wid: epoch for mine in claims for wid, epoch in mine.items()}
    takers = [f"taker-{i}" for i in range(8)]
    taken = race(*[lambda engine=engine: _drain(engine, True) for engine in takers])
    _assert_each_claimed_once(wids, taken, takers)
    assert all(epoch > held[wid] for mine in taken for wid, epoch in mine.items())
    print("taken over per engine:", [len(mine) for mine in taken])


# -- (d) cancel vs a fenced commit ----------------------------------------------------------------


def _mailbox_writes(wid: str, run_id: str, epoch: int) -> tuple[store_commit.WorkflowWrites, datetime]:
    """Writes that add a step and a timer and consume the buffered signal: if they landed after the
    cancel, the timer would outlive the cancel (which deletes every timer of the run)."""
    now = db_now(USING)
    signal_pk = BufferedSignal.objects.get(workflow_id=wid).pk
    timer = Timer(workflow_id=wid, run_id=run_id, kind="sleep", seq=1, fire_at=now + timedelta(hours=1))
    return step_writes(wid, run_id, epoch, timers_add=[timer], signals_consumed=[(signal_pk, 0)]), now


def _check_cancel_vs_commit(wid: str, epoch: int, result: store_commit.FenceResult, cancel_epoch: int) -> str:
    assert cancel_epoch > epoch
    assert claim_of(wid) == (cancel_epoch, None)
    assert Workflow.objects.get(pk=wid).status == "cancelled"
    steps = list(Step.objects.filter(workflow_id=wid).values_list("epoch", flat=True))
    signal_state = BufferedSignal.objects.get(workflow_id=wid).state
    assert not Timer.objects.filter(workflow_id=wid).exists(), "a timer was written after the cancel"
    if result.committed:
        # The commit landed first; the cancel saw it (its timer is gone, its signal stays consumed).
        assert result.committed == {wid} and result.lost == {}
        assert steps == [epoch] and signal_state == "consumed"
        return "commit then cancel"
    # The cancel came first: the commit was refused and wrote nothing.
    assert result.lost == {wid: "released"}, result.lost  # no holder after the cancel's rotation
    assert steps == [] and signal_state == "dropped"
    return "cancel then refused commit"


def test_cancel_racing_a_fenced_commit():
    rng = random.Random(11)
    outcomes: collections.Counter[str] = collections.Counter()
    for round_ in range(80):
        wid = f"cx-{round_}"
        run_id, epoch = start_and_claim(wid)
        weft.signal(wid, "go", 1)
        writes, now = _mailbox_writes(wid, run_id, epoch)
        result, cancel_epoch = race(
            lambda writes=writes, now=now: commit("engine-a", [writes], now),
            lambda wid=wid: transitions.cancel(wid, "race"),
            rng=rng,
        )
        outcomes[_check_cancel_vs_commit(wid, epoch, result, cancel_epoch)] += 1
    print("cancel vs commit:", dict(outcomes))


def test_a_commit_in_flight_blocks_the_cancel_and_the_cancel_sees_it():
    run_id, epoch = start_and_claim("cx-held")
    weft.signal("cx-held", "go", 1)
    with commit_held_before_writes() as (locked, proceed):
        writes, now = _mailbox_writes("cx-held", run_id, epoch)
        committing = Background(lambda: commit("engine-a", [writes], now))
        assert locked.wait(10)
        cancelling = Background(lambda: transitions.cancel("cx-held", "held"))
        wait_for_lock_waiter("SELECT")  # the cancel's claim lock waits for the commit
        assert not cancelling.done.is_set()
        proceed.set()
        result = committing.join()
        cancel_epoch = cancelling.join()
    assert _check_cancel_vs_commit("cx-held", epoch, result, cancel_epoch) == "commit then cancel"


def test_a_commit_after_the_cancel_is_refused():
    run_id, epoch = start_and_claim("cx-late")
    weft.signal("cx-late", "go", 1)
    writes, now = _mailbox_writes("cx-late", run_id, epoch)
    cancel_epoch = transitions.cancel("cx-late", "first")
    result = commit("engine-a", [writes], now)
    assert _check_cancel_vs_commit("cx-late", epoch, result, cancel_epoch) == "cancel then refused commit"
