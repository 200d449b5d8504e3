"""start_many's replacements (on_conflict="start_new") keep the project's lock order: the claims of
the runs it may replace are locked, sorted, in one statement, before any of its writes.

It inserted its new runs first and locked those claims after. A call that keeps the rule (a fork,
a transition: the claim first, then its inserts) and shares an id with it then deadlocked with it:
fork(A, new_id=X) holds A's claim and waits for start_many's insert of X, start_many waits for A's
claim. Outside a caller's transaction each retries after the deadlock; inside one (both join the
caller's ``transaction.atomic()``, as documented) the deadlock reached the caller as a raw
OperationalError.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from weft_django.models import Workflow, WorkflowClaim

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _finished(workflow_id: str) -> None:
    weft.start("tests.sum", args=[1, 2], id=workflow_id)
    Workflow.objects.filter(pk=workflow_id).update(status="completed", result="3")


def test_a_fork_and_a_start_many_sharing_ids_inside_callers_transactions_do_not_deadlock(monkeypatch):
    _finished("lo-A")
    fork_holds_a, start_many_writing = threading.Event(), threading.Event()
    from weft_django.store import claims as store_claims
    from weft_django.store import forks, runs_bulk

    real_recorded, real_lock_ids, real_create_runs = forks.recorded_steps, store_claims.lock_ids, runs_bulk.create_runs
    main = threading.get_ident()

    def recorded(run_id, using):
        found = real_recorded(run_id, using)
        fork_holds_a.set()  # the fork holds A's claim and row
        start_many_writing.wait(10)  # until start_many wrote or locked (whichever it does first)
        return found

    def lock_ids(ids, using, **kw):
        if threading.get_ident() == main and ids:
            start_many_writing.set()
        return real_lock_ids(ids, using, **kw)

    def create_runs(runs, using):
        inserted = real_create_runs(runs, using)
        if threading.get_ident() == main:
            start_many_writing.set()
        return inserted

    monkeypatch.setattr(forks, "recorded_steps", recorded)
    monkeypatch.setattr(store_claims, "lock_ids", lock_ids)
    monkeypatch.setattr(runs_bulk, "create_runs", create_runs)
    fork_outcome: list[object] = []

    def do_fork():
        try:
            with transaction.atomic():
                fork_outcome.append(weft.fork("lo-A", from_step=0, new_id="lo-X"))
        except BaseException as exc:
            fork_outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=do_fork, daemon=True)
    thread.start()
    assert fork_holds_a.wait(10)
    try:
        with transaction.atomic():
            started: object = weft.start_many(
                [
                    weft.StartRequest("tests.sum", args=[5, 6], id="lo-X"),
                    weft.StartRequest("tests.sum", args=[7, 8], id="lo-A", on_conflict="start_new"),
                ]
            )
    except BaseException as exc:
        started = exc
    thread.join(60)
    assert not thread.is_alive()
    raw = [o for o in [started, *fork_outcome] if isinstance(o, BaseException) and not isinstance(o, weft.WeftError)]
    assert not raw, [f"{type(e).__name__}: {e}" for e in raw]
    # Serialised on A's claim: the fork came first (it held A) and made X; start_many then met X.
    assert isinstance(fork_outcome[0], weft.WorkflowHandle), fork_outcome
    assert isinstance(started, list), started
    assert isinstance(started[0], weft.WorkflowAlreadyExistsError) and isinstance(started[1], weft.WorkflowHandle)
    assert Workflow.objects.get(pk="lo-A").status == "running"  # replaced by start_many
    assert WorkflowClaim.objects.filter(pk__in=["lo-A", "lo-X"]).count() == 2


def test_start_many_locks_the_claims_it_may_replace_before_its_first_write():
    _finished("lo-b")
    _finished("lo-d")
    requests = [
        weft.StartRequest("tests.sum", args=[1, 1], id="lo-a"),
        weft.StartRequest("tests.sum", args=[1, 1], id="lo-d", on_conflict="start_new"),
        weft.StartRequest("tests.sum", args=[1, 1], id="lo-b", on_conflict="start_new"),
        weft.StartRequest("tests.sum", args=[1, 1], id="lo-c"),
    ]
    table = WorkflowClaim._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        results = weft.start_many(requests)
    assert all(isinstance(r, weft.WorkflowHandle) for r in results), results
    statements = [q["sql"] for q in queries.captured_queries]
    writes = [i for i, sql in enumerate(statements) if _writes(sql)]
    locks = [i for i, sql in enumerate(statements) if table in sql and "FOR NO KEY UPDATE" in sql]
    assert locks and writes, statements
    assert "lo-b" in statements[locks[0]] and "lo-d" in statements[locks[0]]  # one statement, both
    assert locks[0] < writes[0], [s[:120] for s in statements]


def _writes(sql: str) -> bool:
    text = sql.lstrip().upper()
    if text.startswith(("INSERT", "UPDATE", "DELETE")):
        return True
    return text.startswith("WITH") and any(word in text for word in (" INSERT INTO ", " UPDATE ", " DELETE FROM "))
