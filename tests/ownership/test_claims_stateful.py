"""Claims and fencing as a state machine, against the real database (PostgreSQL or SQLite).

Hypothesis drives two engines ("engine-a", "engine-b") and outside callers over a few workflow ids:
acquire, expire (time passes for one claim), takeover, renew, release, fenced commits (steps, and
terminal commits), and the external transitions cancel / suspend / resume / retry / purge / start.
A small model predicts, per id, the claim (epoch, holder, expired), the run's status and every Step
row; the database must agree after every step.

Invariants checked after every step:
- I4: the epochs seen for an id strictly increase over time, across purge and a new start of the id;
- at most one engine passes the fence for an id, and exactly the one the model names;
- a holder exists only on a running workflow, with an expiry, and no expiry without a holder;
- Step rows are exactly those of the commits the model accepted (a refused commit writes nothing),
  and there is at most one Step per (run, seq) (I1).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.db.models import Count
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import weft_django as weft
from weft_django import transitions
from weft_django.engine import fencing, ownership
from weft_django.engine.driver import StepRecord
from weft_django.exceptions import (
    WorkflowAlreadyExistsError,
    WorkflowNotFoundError,
    WorkflowStateError,
    WorkflowTerminalError,
)
from weft_django.models import (
    AppliedUpdate,
    BufferedSignal,
    ClockOffset,
    Engine,
    IdempotencyKey,
    PendingUpdate,
    QueryRequest,
    Step,
    Timer,
    Workflow,
    WorkflowClaim,
)
from weft_django.store import claims as store_claims
from weft_django.store import commit as store_commit
from weft_django.store.clock import db_now

IDS = ("sm-0", "sm-1", "sm-2")
ENGINES = ("engine-a", "engine-b")
USING = "default"
TTL = timedelta(seconds=30)
RENEW = timedelta(seconds=5)
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)
RUNNING, SUSPENDED, COMPLETED, FAILED, CANCELLED = "running", "suspended", "completed", "failed", "cancelled"
ABSENT = "absent"  # never started, or purged
TERMINAL = {COMPLETED, FAILED, CANCELLED}

SETTINGS = settings(
    max_examples=30,
    stateful_step_count=25,
    deadline=None,
    database=None,  # keep no example database in the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# How often each outcome happened across all examples (printed with -s): a check that the rules
# reach the interesting cases (takeovers, refused commits of each reason, I4 across purge + start).
SEEN: collections.Counter[str] = collections.Counter()


@dataclasses.dataclass
class Wf:
    status: str = ABSENT
    epoch: int | None = None
    holder: str | None = None
    expired: bool = False
    run_id: str | None = None
    fail_seq: int | None = None  # the seq a failed run's error names (retry deletes that step)
    history: list[int] = dataclasses.field(default_factory=list)  # every epoch the id had, in order


def _reset_tables() -> None:
    for model in (
        Step,
        Timer,
        BufferedSignal,
        PendingUpdate,
        AppliedUpdate,
        QueryRequest,
        IdempotencyKey,
        WorkflowClaim,
        Workflow,
        Engine,
        ClockOffset,
    ):
        model.objects.using(USING).all().delete()


class ClaimsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        _reset_tables()
        self.wf = {wid: Wf() for wid in IDS}
        # What each engine believes it holds: workflow id -> epoch (kept until renew finds it lost,
        # the engine releases it or a commit is refused: meanwhile the engine is a zombie).
        self.beliefs: dict[str, dict[str, int]] = {engine: {} for engine in ENGINES}
        self.run_of_epoch: dict[int, str] = {}
        self.steps: dict[tuple[str, str, int], tuple[int, str]] = {}  # (wid, run, seq) -> (epoch, result)
        self.markers = itertools.count()
        for wid in IDS:
            self._start(wid, "error")

    # -- model helpers --------------------------------------------------------------------------
    def _rotated(self, wid: str, epoch: int) -> None:
        """The claim of ``wid`` got a new epoch (acquire, takeover, transition, start)."""
        w = self.wf[wid]
        assert epoch > max(w.history, default=0), f"I4: {wid} epoch {epoch} after {w.history}"
        w.history.append(epoch)
        w.epoch = epoch
        assert w.run_id is not None
        self.run_of_epoch[epoch] = w.run_id

    def _db_epoch(self, wid: str) -> int:
        return WorkflowClaim.objects.using(USING).get(pk=wid).epoch

    def _cleared(self, wid: str) -> None:
        self.wf[wid].holder = None
        self.wf[wid].expired = False

    def _holds(self, engine: str, wid: str, epoch: int) -> bool:
        w = self.wf[wid]
        return w.status != ABSENT and w.epoch == epoch and w.holder == engine

    def _expected_refusal(self, wid: str) -> str:
        w = self.wf[wid]
        if w.status == ABSENT:
            return "missing"
        return "released" if w.holder is None else "deposed"

    def _drop_steps(self, wid: str, run_id: str | None = None, seq: int | None = None) -> None:
        for key in list(self.steps):
            if key[0] == wid and (run_id is None or key[1] == run_id) and (seq is None or key[2] == seq):
                del self.steps[key]

    def _start(self, wid: str, on_conflict: str) -> None:
        w = self.wf[wid]
        if w.status != ABSENT and (on_conflict == "error" or w.status not in TERMINAL):
            with pytest.raises(WorkflowAlreadyExistsError):
                weft.start("tests.sum", args=[1, 2], id=wid, on_conflict=on_conflict)
            return
        weft.start("tests.sum", args=[1, 2], id=wid, on_conflict=on_conflict)
        SEEN["start" if w.status == ABSENT and w.history else "start_new" if w.status != ABSENT else "first start"] += 1
        if w.status != ABSENT:
            self._drop_steps(wid)  # start_new deletes the old run's rows
        w.status, w.fail_seq = RUNNING, None
        w.run_id = str(Workflow.objects.using(USING).get(pk=wid).run_id)
        self._cleared(wid)
        self._rotated(wid, self._db_epoch(wid))

    # -- engines ---------------------------------------------------------------------------------
    @initialize(engine=st.sampled_from(ENGINES))
    def first_acquire(self, engine: str) -> None:
        """Every example begins with one engine claiming the fresh runs (as an engine would)."""
        self.acquire(engine)

    @rule(engine=st.sampled_from(ENGINES))
    def acquire(self, engine: str) -> None:
        expected = {wid for wid, w in self.wf.items() if w.status == RUNNING and w.holder is None}
        got = ownership.acquire(engine, limit=10, ttl=TTL, renew_interval=RENEW, using=USING)
        assert set(got) == expected, (got, expected)
        for wid, (epoch, previous) in got.items():
            assert previous is None
            self._rotated(wid, epoch)
            self.wf[wid].holder, self.wf[wid].expired = engine, False
            self.beliefs[engine][wid] = epoch

    @precondition(lambda self: any(w.holder is not None for w in self.wf.values()))
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """Time passes for this claim only: its expiry (and the takeover grace) lie far behind."""
        wid = data.draw(st.sampled_from([wid for wid in IDS if self.wf[wid].holder is not None]), label="wid")
        WorkflowClaim.objects.using(USING).filter(pk=wid, engine_id__isnull=False).update(expires_at=LONG_AGO)
        self.wf[wid].expired = self.wf[wid].holder is not None

    @precondition(lambda self: any(w.holder is not None for w in self.wf.values()))
    @rule(engine=st.sampled_from(ENGINES))
    def takeover(self, engine: str) -> None:
        expected = {
            wid: w.holder for wid, w in self.wf.items() if w.status == RUNNING and w.holder is not None and w.expired
        }
        got = ownership.acquire(engine, limit=10, ttl=TTL, renew_interval=RENEW, using=USING, takeover=True)
        assert {wid: previous for wid, (_, previous) in got.items()} == expected
        SEEN["takeover"] += len(got)
        for wid, (epoch, _) in got.items():
            self._rotated(wid, epoch)
            self.wf[wid].holder, self.wf[wid].expired = engine, False
            self.beliefs[engine][wid] = epoch

    @precondition(lambda self: any(w.holder is not None for w in self.wf.values()))
    @rule(data=st.data(), engine=st.sampled_from(ENGINES))
    def stall_then_takeover(self, data: st.DataObject, engine: str) -> None:
        """The holder of one claim stalls past TTL + grace; an engine (maybe the same one) takes over."""
        self.expire(data)
        self.takeover(engine)

    def _pick(self, data: st.DataObject, engine: str) -> tuple[str, int]:
        """A (workflow id, epoch) the engine acts on: mostly one it believes it holds (possibly stale:
        a zombie that has not renewed yet), sometimes any epoch the id ever had (a zombie from an
        earlier generation, or a renewal thread that has not seen the latest acquire)."""
        owned = sorted(self.beliefs[engine])
        if owned and data.draw(st.sampled_from([True, True, True, False]), label="believed"):
            wid = data.draw(st.sampled_from(owned), label="wid")
            return wid, self.beliefs[engine][wid]
        wid = data.draw(st.sampled_from(IDS), label="wid")
        return wid, data.draw(st.sampled_from(self.wf[wid].history[-4:]), label="epoch")

    @rule(data=st.data(), engine=st.sampled_from(ENGINES), stale=st.sampled_from([False, False, True]))
    def renew(self, data: st.DataObject, engine: str, stale: bool) -> None:
        """Renew everything the engine believes it holds; with ``stale``, one entry carries an epoch
        from another generation. Lost iff the row has another epoch or holder."""
        owned = dict(self.beliefs[engine])
        if stale:  # mostly a claim the engine does hold now, at an older epoch of the id
            mine = [wid for wid in IDS if self.wf[wid].holder == engine]
            wid = data.draw(st.sampled_from(mine * 2 + list(IDS)), label="stale wid")
            older = self.wf[wid].history[-4:-1] or self.wf[wid].history
            owned[wid] = data.draw(st.sampled_from(older), label="stale epoch")
        lost = ownership.renew(engine, owned, TTL, USING)
        expected = {wid for wid, epoch in owned.items() if not self._holds(engine, wid, epoch)}
        assert lost == expected, (owned, lost, expected)
        SEEN["renew kept"] += len(owned) - len(lost)
        SEEN["renew lost"] += len(lost)
        for wid, epoch in owned.items():
            if wid not in lost:
                self.wf[wid].expired = False
            elif self.beliefs[engine].get(wid) == epoch:
                del self.beliefs[engine][wid]  # the engine stops driving it

    @rule(data=st.data(), engine=st.sampled_from(ENGINES))
    def release(self, data: st.DataObject, engine: str) -> None:
        """Graceful release (shutdown) of a claim at an epoch: effective only if the row is still
        (that epoch, this engine)."""
        wid, epoch = self._pick(data, engine)
        if self.beliefs[engine].get(wid) == epoch:
            del self.beliefs[engine][wid]
        effective = self._holds(engine, wid, epoch)
        ownership.release(engine, {wid: epoch}, USING)
        SEEN[f"release {'effective' if effective else 'stale'}"] += 1
        if effective:
            self._cleared(wid)  # holder cleared, epoch kept

    def _commit(self, data: st.DataObject, *, finish: bool) -> None:
        engine = data.draw(st.sampled_from(ENGINES), label="engine")
        wid, epoch = self._pick(data, engine)
        w = self.wf[wid]
        seq = data.draw(st.integers(0, 2), label="seq")
        run_id = self.run_of_epoch[epoch]
        marker = f'"m{next(self.markers)}"'
        writes = store_commit.WorkflowWrites(
            wid, run_id, epoch, steps=[StepRecord(seq, "activity", "add", "completed", marker, attempts=1)]
        )
        status = fail_seq = None
        if finish:
            status = data.draw(st.sampled_from([COMPLETED, FAILED]), label="status")
            error = None
            if status == FAILED:
                fail_seq = data.draw(st.one_of(st.none(), st.integers(0, 2)), label="fail_seq")
                error = {"type": "ActivityError", "message": "boom"}
                if fail_seq is not None:
                    error["seq"] = fail_seq
            writes.finish = store_commit.Finish(status, result="3" if status == COMPLETED else None, error=error)
        expected_ok = self._holds(engine, wid, epoch)
        expected_reason = None if expected_ok else self._expected_refusal(wid)
        result = fencing.fenced_commit(engine, [writes], db_now(USING), USING)
        SEEN[f"commit {'terminal ' if finish else ''}{expected_reason or 'ok'}"] += 1
        if expected_ok:
            assert result.committed == {wid} and result.lost == {}, result
            self.steps[(wid, run_id, seq)] = (epoch, marker)
            if finish:
                assert status is not None
                w.status, w.fail_seq = status, fail_seq
                self._cleared(wid)  # the terminal commit releases (epoch kept)
        else:
            assert result.committed == set() and result.lost == {wid: expected_reason}, (result, expected_reason)
            if self.beliefs[engine].get(wid) == epoch:
                del self.beliefs[engine][wid]  # refused: the engine stops driving it

    @rule(data=st.data())
    def commit_step(self, data: st.DataObject) -> None:
        self._commit(data, finish=False)

    @rule(data=st.data())
    def commit_terminal(self, data: st.DataObject) -> None:
        self._commit(data, finish=True)

    # -- outside callers -------------------------------------------------------------------------
    @rule(wid=st.sampled_from(IDS))
    def cancel(self, wid: str) -> None:
        w = self.wf[wid]
        handle = weft.get_handle(wid)
        if w.status == ABSENT:
            with pytest.raises(WorkflowNotFoundError):
                handle.cancel()
        elif w.status in TERMINAL:
            with pytest.raises(WorkflowTerminalError):
                handle.cancel()
        else:
            handle.cancel("stateful")
            SEEN["cancel"] += 1
            w.status = CANCELLED
            self._cleared(wid)
            self._rotated(wid, self._db_epoch(wid))

    def _set_status(self, wid: str, action: str, required: str, new_status: str) -> None:
        w = self.wf[wid]
        call = getattr(transitions, action)
        if w.status == ABSENT:
            with pytest.raises(WorkflowNotFoundError):
                call(wid)
        elif w.status != required:
            with pytest.raises(WorkflowStateError):
                call(wid)
        else:
            epoch = call(wid)
            SEEN[action] += 1
            assert epoch == self._db_epoch(wid)
            if action == "retry" and w.fail_seq is not None:
                assert w.run_id is not None
                self._drop_steps(wid, w.run_id, w.fail_seq)
            w.status, w.fail_seq = new_status, None
            self._cleared(wid)
            self._rotated(wid, epoch)

    @rule(wid=st.sampled_from(IDS))
    def suspend(self, wid: str) -> None:
        self._set_status(wid, "suspend", RUNNING, SUSPENDED)

    @rule(wid=st.sampled_from(IDS))
    def resume(self, wid: str) -> None:
        self._set_status(wid, "resume", SUSPENDED, RUNNING)

    @rule(wid=st.sampled_from(IDS))
    def retry(self, wid: str) -> None:
        self._set_status(wid, "retry", FAILED, RUNNING)

    @rule(wid=st.sampled_from(IDS), restart=st.booleans())
    def purge(self, wid: str, restart: bool) -> None:
        """Purge a finished run and, with ``restart``, start the id again at once: its new epoch must
        lie above every epoch the id had before (I4 across purge and reuse)."""
        w = self.wf[wid]
        if w.status in (RUNNING, SUSPENDED):
            with pytest.raises(WorkflowStateError):
                transitions.purge(wid, using=USING)
            return
        assert transitions.purge(wid, using=USING) == (0 if w.status == ABSENT else 1)
        SEEN["purge" if w.status != ABSENT else "purge absent"] += 1
        self._drop_steps(wid)
        w.status, w.epoch, w.run_id, w.fail_seq = ABSENT, None, None, None
        self._cleared(wid)  # the history stays
        if restart:
            self._start(wid, "error")

    @rule(wid=st.sampled_from(IDS), on_conflict=st.sampled_from(["error", "start_new"]))
    def start(self, wid: str, on_conflict: str) -> None:
        self._start(wid, on_conflict)

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def claims_match_the_model(self) -> None:
        claims = {c.workflow_id: c for c in WorkflowClaim.objects.using(USING).all()}
        statuses = dict(Workflow.objects.using(USING).values_list("id", "status"))
        now = db_now(USING)
        for wid, w in self.wf.items():
            assert w.history == sorted(set(w.history)), f"I4: {wid} epochs {w.history}"
            if w.status == ABSENT:
                assert wid not in claims and wid not in statuses
                continue
            claim = claims[wid]
            assert statuses[wid] == w.status
            assert (claim.epoch, claim.engine_id) == (w.epoch, w.holder), (wid, claim, w)
            assert (claim.expires_at is None) == (claim.engine_id is None), claim
            if w.holder is not None:
                assert w.status == RUNNING, f"{wid} held by {w.holder} while {w.status}"
                assert claim.expires_at is not None
                assert (claim.expires_at < now - timedelta(days=1)) == w.expired, (claim.expires_at, w)

    @invariant()
    def at_most_one_engine_passes_the_fence(self) -> None:
        """The fence (lock_claims) lets through exactly the (engine, epoch) the model says holds the
        id: checked for each engine's beliefs and for the id's last few epochs (stale generations)."""
        passing: dict[str, set[str]] = {wid: set() for wid in IDS}
        depth = min(3, max(len(w.history) for w in self.wf.values()))
        probes = [(engine, dict(self.beliefs[engine])) for engine in ENGINES] + [
            (engine, {wid: w.history[-1 - k] for wid, w in self.wf.items() if len(w.history) > k})
            for engine in ENGINES
            for k in range(depth)
        ]
        with transaction.atomic(using=USING):
            seen = [(engine, epochs, store_claims.lock_claims(engine, epochs, USING)) for engine, epochs in probes]
        for engine, epochs, held in seen:
            expected = {wid for wid, epoch in epochs.items() if self._holds(engine, wid, epoch)}
            assert held == expected, (engine, epochs, held)
            for wid in held:
                passing[wid].add(engine)
        for wid, engines in passing.items():
            assert len(engines) <= 1, f"{wid} passes the fence for {engines}"
            assert engines <= {self.wf[wid].holder}

    @invariant()
    def steps_are_exactly_the_accepted_commits(self) -> None:
        rows = list(Step.objects.using(USING).values_list("workflow_id", "run_id", "seq", "epoch", "result"))
        actual = {(wid, str(run), seq): (epoch, result) for wid, run, seq, epoch, result in rows}
        assert len(actual) == len(rows)
        assert actual == self.steps
        duplicates = Step.objects.using(USING).values("run_id", "seq").annotate(n=Count("id")).filter(n__gt=1)
        assert not duplicates.exists(), "I1: more than one Step per (run, seq)"


@pytest.mark.timeout(900)  # room for Hypothesis to shrink a failure (it may take minutes)
@pytest.mark.django_db(transaction=True)
def test_claims_state_machine():
    SEEN.clear()
    run_state_machine_as_test(ClaimsMachine, settings=SETTINGS)
    print("outcomes:", dict(sorted(SEEN.items())))
