"""weft.start_many / astart_many: the rows each request writes (as start() writes them), per-request
conflict results, the caller's transaction, the bad-input table (typed error naming the request,
nothing written) and concurrent calls with overlapping ids and keys. Both databases unless marked."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connections, transaction
from django.utils import timezone

import weft_django as weft
from tests.client.test_bad_inputs import snapshot
from weft_django.client.bulk import MAX_START_MANY
from weft_django.exceptions import (
    IdempotencyKeyPurgedError,
    InvalidArgumentError,
    InvalidWorkflowIdError,
    PayloadNotSerializableError,
    WorkflowAlreadyExistsError,
    WorkflowNotRegisteredError,
)
from weft_django.models import IdempotencyKey, Timer, Workflow, WorkflowClaim
from weft_django.transitions import purge

pytestmark = pytest.mark.django_db


def R(*args, **options) -> weft.StartRequest:
    return weft.StartRequest("tests.sum", args=list(args or (1, 2)), **options)


def test_each_request_writes_what_start_writes() -> None:
    started = weft.start("tests.sum", args=[1, 2], id="one-by-one", start_after="1h", execution_timeout="2h")
    handles = weft.start_many(
        [
            R(1, 2, id="bulk-0"),
            R(1, 2, id="bulk-delayed", start_after="1h", execution_timeout="2h"),
            R(3, 4, idempotency_key="bulk-key"),
            R(5, 6, start_at=timezone.now() - timedelta(hours=1)),  # in the past: starts now
        ]
    )
    assert [type(h) for h in handles] == [weft.WorkflowHandle] * 4
    assert handles[0].id == "bulk-0" and handles[1].id == "bulk-delayed"
    fields = ("workflow_type", "version", "status", "input", "parent_close_policy", "depth", "current_step")
    single = Workflow.objects.filter(pk=started.id).values(*fields).get()
    assert Workflow.objects.filter(pk="bulk-delayed").values(*fields).get() == single
    delayed = Workflow.objects.get(pk="bulk-delayed")
    assert delayed.status == "pending" and delayed.started_at is None
    assert delayed.execution_deadline - delayed.start_at == timedelta(hours=2)
    assert delayed.start_at - delayed.created_at == timedelta(hours=1)
    assert Timer.objects.filter(workflow_id="bulk-delayed", kind="delayed_start").count() == 1
    now_started = Workflow.objects.get(pk=handles[3].id)
    assert now_started.status == "running" and now_started.started_at == now_started.created_at
    assert not Timer.objects.filter(workflow_id=handles[3].id).exists()
    keyed = IdempotencyKey.objects.get(pk="bulk-key")
    assert keyed.workflow_id == handles[2].id
    assert str(keyed.run_id) == str(Workflow.objects.get(pk=handles[2].id).run_id)
    claims = WorkflowClaim.objects.filter(workflow_id__in=[h.id for h in handles])
    assert claims.count() == 4
    assert {c.engine_id for c in claims} == {None} and all(c.runnable for c in claims)
    assert len({c.epoch for c in claims}) == 4  # a fresh epoch each, from the one sequence
    assert weft.start_many([]) == []


def test_conflicts_are_per_request_results() -> None:
    weft.start("tests.sum", args=[1, 2], id="taken")
    weft.start("tests.sum", args=[1, 2], id="taken-too")
    weft.start("tests.sum", args=[1, 2], id="finished")
    Workflow.objects.filter(pk="finished").update(status="completed", result="3")
    weft.start("tests.signals", id="other-type")
    weft.start("tests.sum", args=[1, 2], idempotency_key="used-key")
    purged = weft.start("tests.sum", args=[1, 2], idempotency_key="purged-key")
    Workflow.objects.filter(pk=purged.id).update(status="completed", result="3")
    purge(purged.id)
    key_run = IdempotencyKey.objects.get(pk="used-key").workflow_id
    before = Workflow.objects.count()
    results = weft.start_many(
        [
            R(id="taken"),
            R(id="fresh-1"),
            R(id="taken-too", on_conflict="use_existing"),
            R(id="finished", on_conflict="start_new"),
            R(id="other-type", on_conflict="use_existing"),
            R(idempotency_key="used-key"),
            R(idempotency_key="purged-key"),
            R(id="fresh-2"),
        ]
    )
    assert isinstance(results[0], WorkflowAlreadyExistsError) and results[0].index == 0
    assert "requests[0]" in str(results[0]) and "on_conflict" in str(results[0])
    assert results[1].id == "fresh-1" and results[2].id == "taken-too" and results[3].id == "finished"
    assert isinstance(results[4], WorkflowAlreadyExistsError) and "tests.signals" in str(results[4])
    assert results[5].id == key_run
    assert isinstance(results[6], IdempotencyKeyPurgedError) and results[6].index == 6
    assert results[7].id == "fresh-2"
    assert Workflow.objects.count() == before + 2
    assert Workflow.objects.get(pk="finished").status == "running"  # a new run over the finished one


def test_joins_the_callers_transaction() -> None:
    before = snapshot()
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.start_many([R(id=f"rolled-{i}") for i in range(50)])
        assert Workflow.objects.filter(id__startswith="rolled-").count() == 50  # visible inside
        raise RuntimeError("the caller rolls back")
    assert snapshot() == before
    with transaction.atomic():
        weft.start_many([R(id=f"kept-{i}") for i in range(50)])
    assert Workflow.objects.filter(id__startswith="kept-").count() == 50


def test_async_twin() -> None:
    handles = async_to_sync(weft.astart_many)([R(id="async-1"), R(id="async-2")])
    assert [h.id for h in handles] == ["async-1", "async-2"]


class Unserialisable:
    pass


def _many(*bad: weft.StartRequest | object, at: int = 3) -> list:
    good = [R(id=f"good-{i}") for i in range(6)]
    return good[:at] + list(bad) + good[at:]


BAD = [
    # (case, requests, exception type, fragment of the message)
    ("not a list", lambda: R(), InvalidArgumentError, "list of weft.StartRequest"),
    ("a string", lambda: "tests.sum", InvalidArgumentError, "list of weft.StartRequest"),
    ("a dict among requests", lambda: _many({"workflow": "tests.sum"}), InvalidArgumentError, "requests[3]"),
    ("too many", lambda: [R()] * (MAX_START_MANY + 1), InvalidArgumentError, "at most 100,000"),
    ("duplicate ids", lambda: _many(R(id="good-1")), InvalidArgumentError, "requests[1]"),
    (
        "duplicate keys",
        lambda: [R(idempotency_key="k"), R(), R(idempotency_key="k")],
        InvalidArgumentError,
        "requests[2]: idempotency_key 'k' is also the idempotency_key of requests[0]",
    ),
    ("bad payload", lambda: _many(R(Unserialisable(), 1)), PayloadNotSerializableError, "requests[3]"),
    (
        "unknown workflow",
        lambda: _many(weft.StartRequest("no.such.workflow")),
        WorkflowNotRegisteredError,
        "requests[3]",
    ),
    ("args a string", lambda: _many(weft.StartRequest("tests.sum", args="12")), InvalidArgumentError, "requests[3]"),
    ("bad id", lambda: _many(R(id="a\nb")), InvalidWorkflowIdError, "requests[3]"),
    ("id and key", lambda: _many(R(id="x", idempotency_key="y")), InvalidArgumentError, "mutually exclusive"),
    ("bad on_conflict", lambda: _many(R(id="x", on_conflict="ignore")), InvalidArgumentError, "on_conflict"),
    ("bad delay", lambda: _many(R(start_after="soon")), InvalidArgumentError, "requests[3]"),
    ("bad timeout", lambda: _many(R(execution_timeout=-1)), InvalidArgumentError, "requests[3]"),
]


@pytest.mark.parametrize(("case", "requests", "error", "fragment"), BAD, ids=[c[0] for c in BAD])
def test_bad_input_writes_nothing(case, requests, error, fragment) -> None:
    weft.start("tests.sum", args=[1, 1], id="existing")
    before = snapshot()
    with pytest.raises(error) as raised:
        weft.start_many(requests())
    assert fragment in str(raised.value)
    if "requests[" in fragment and case not in ("duplicate ids", "duplicate keys"):
        assert raised.value.index == 3
    assert snapshot() == before


def test_bad_request_inside_a_transaction_leaves_it_usable() -> None:
    before = snapshot()
    with transaction.atomic():
        with pytest.raises(WorkflowNotRegisteredError):
            weft.start_many(_many(weft.StartRequest("no.such.workflow")))
        weft.start_many([R(id="after-the-error")])
    assert snapshot()["Workflow"] == before["Workflow"] + 1


def test_a_hundred_thousand_requests_in_one_call() -> None:
    """The upper bound itself works: chunked into statements of store.runs_bulk.CHUNK_ROWS rows within one
    transaction. On SQLite (a loop of create_run in one transaction) 5,000: the 100,000 work there too, in
    about a minute on the 2-core test machine, too long for the suite."""
    count = MAX_START_MANY if connections["default"].vendor == "postgresql" else 5000
    before = Workflow.objects.count()
    results = weft.start_many([weft.StartRequest("tests.sum", args=[i, 1]) for i in range(count)])
    assert len(results) == count and all(isinstance(r, weft.WorkflowHandle) for r in results)
    assert len({r.id for r in results}) == count
    assert Workflow.objects.count() == before + count
    assert WorkflowClaim.objects.filter(engine_id__isnull=True).count() == before + count


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_calls_with_overlapping_ids_and_keys() -> None:
    """Two threads, each one start_many over the same 300 keys and 300 ids (in opposite orders): each key
    and each id ends with exactly one run, and each thread got a handle (its own or the other's) for all."""
    keys = [f"ck-{i:03}" for i in range(300)]
    ids = [f"ci-{i:03}" for i in range(300)]
    barrier = threading.Barrier(2)
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def client(n: int) -> None:
        order = 1 if n == 0 else -1
        requests = [R(idempotency_key=k) for k in keys[::order]]
        requests += [R(id=i, on_conflict="use_existing") for i in ids[::order]]
        try:
            barrier.wait()
            results[n] = weft.start_many(requests)
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert Workflow.objects.filter(id__startswith="ci-").count() == 300
    assert IdempotencyKey.objects.filter(key__startswith="ck-").count() == 300
    assert Workflow.objects.filter(idempotency_key__startswith="ck-").count() == 300
    by_key = dict(IdempotencyKey.objects.filter(key__startswith="ck-").values_list("key", "workflow_id"))
    for n, order in ((0, 1), (1, -1)):
        assert all(isinstance(r, weft.WorkflowHandle) for r in results[n])
        assert [r.id for r in results[n][:300]] == [by_key[k] for k in keys[::order]]
        assert [r.id for r in results[n][300:]] == ids[::order]
