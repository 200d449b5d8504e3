"""start_many under bad values and races: a datetime attribute outside years 1-9999 in UTC, the duplicate's
.index, the started-runs metric of a rolled-back call, the chunks' size, and start_new's lock order."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from django.db import OperationalError, connection, connections, transaction

import weft_django as weft
from tests.testapp import visibility_workflows  # noqa: F401 - registers visibility.order
from weft_django import transitions
from weft_django.exceptions import InvalidArgumentError, InvalidSearchAttributeError
from weft_django.models import Workflow

pytestmark = pytest.mark.django_db

# Aware datetimes Python accepts whose UTC instant is outside years 1..9999 (Python's, and Django's, range).
LATE = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))  # 10000-01-01 04:00 UTC
EARLY = datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1)))  # year 0 (1 BC) in UTC


@pytest.mark.parametrize("moment", [LATE, EARLY], ids=["after-9999", "before-year-1"])
def test_a_datetime_attribute_out_of_utc_range_is_a_typed_error_not_a_poisoned_row(moment) -> None:
    """start_many (and start) accept any aware datetime as a datetime search attribute. On SQLite the
    whole batch then fails with a raw OverflowError from Django's conversion to UTC; on PostgreSQL it
    is stored, and every later list_workflows() page that includes the run fails with DataError
    (psycopg cannot load the value), for every caller, not only this run's."""
    weft.start_many([weft.StartRequest("visibility.order", args=["ok", 1.0], id="neighbour")])
    with pytest.raises(InvalidSearchAttributeError):
        weft.start_many(
            [weft.StartRequest("visibility.order", args=["b", 1.0], id="poison", attributes={"placed_at": moment})]
        )
    assert [s.id for s in weft.list_workflows()] == ["neighbour"]


def test_a_duplicate_id_error_has_index_like_every_other_bad_request() -> None:
    """docs/howto.md: for every check made before writing (two requests with the same id or key among
    them) 'its message starts with requests[i]: and .index is i'. The duplicate's error has no .index."""
    with pytest.raises(InvalidArgumentError) as raised:
        weft.start_many([weft.StartRequest("tests.sum", args=[1, 2], id="dup")] * 2)
    assert str(raised.value).startswith("requests[1]:")
    assert raised.value.index == 1


@pytest.mark.parametrize("moment", [LATE, EARLY], ids=["after-9999", "before-year-1"])
def test_listing_still_works_for_the_other_runs_after_such_a_start(moment) -> None:
    """Whatever start_many does with that value (refuse it, typed), the other runs stay listable."""
    weft.start_many([weft.StartRequest("visibility.order", args=["ok", 1.0], id="neighbour")])
    try:
        with transaction.atomic():
            weft.start_many(
                [weft.StartRequest("visibility.order", args=["b", 1.0], id="poison", attributes={"placed_at": moment})]
            )
    except InvalidSearchAttributeError:
        pass
    assert "neighbour" in [s.id for s in weft.list_workflows()]


def test_a_rolled_back_start_many_is_not_counted_as_started() -> None:
    """weft_workflows_started_total ("runs this process started", docs/operations.md) is incremented
    inside the transaction, once per inserted run: a caller's atomic() that rolls back 50 starts back
    still counts 50 started runs."""
    from weft_django import metrics

    if not metrics.AVAILABLE:
        pytest.skip("prometheus_client is not installed")
    before = metrics.WORKFLOWS_STARTED._value.get()
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.start_many([weft.StartRequest("tests.sum", args=[1, 2], id=f"rolled-{i}") for i in range(50)])
        raise RuntimeError("the caller rolls back")
    assert metrics.WORKFLOWS_STARTED._value.get() == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_start_new_over_two_finished_runs_does_not_deadlock_with_a_purge_of_them(monkeypatch) -> None:
    """start_new locked each replaced run's claim one at a time, in Python's order, after other writes.
    A purge locks in the database's ORDER BY, which under a non-C collation (en_US, a usual initdb
    default) differs ("B" < "a" in Python, "a" < "B" in en_US): the two deadlocked. Now start_many locks
    the claims it replaces in one statement first; the purge waits, then finds the new runs active."""
    with connection.cursor() as cursor:  # as in a database created with LC_COLLATE=en_US.UTF-8
        cursor.execute(
            'ALTER TABLE weft_django_workflowclaim ALTER COLUMN workflow_id TYPE varchar(255) COLLATE "en-US-x-icu"'
        )
    try:
        for wid in ("B", "a"):
            weft.start("tests.sum", args=[1, 2], id=wid)
        Workflow.objects.filter(pk__in=["B", "a"]).update(status="completed", result="3")
        purge_errors: list[BaseException] = []

        def purge_both() -> None:
            try:
                with connections["default"].cursor() as cursor:
                    cursor.execute("SET deadlock_timeout = '20s'")  # the start_many side detects the cycle
                transitions.purge(["a", "B"])
            except BaseException as error:  # reported below
                purge_errors.append(error)
            finally:
                connections.close_all()

        real, started = transitions.lock_workflow, []

        def second_lock_after_a_purge_began(workflow_id: str, using: str):
            if workflow_id == "a" and not started:  # "B" is replaced already, its claim held by us
                thread = threading.Thread(target=purge_both)
                thread.start()
                started.append(thread)
                time.sleep(1.0)  # the purge locks "a" (en_US order), then waits for "B"
            return real(workflow_id, using)

        monkeypatch.setattr(transitions, "lock_workflow", second_lock_after_a_purge_began)
        results = weft.start_many(
            [weft.StartRequest("tests.sum", args=[1, 2], id=w, on_conflict="start_new") for w in ("a", "B")]
        )
        started[0].join(60)
        assert [type(r) for r in results] == [weft.WorkflowHandle, weft.WorkflowHandle]
        assert not [error for error in purge_errors if isinstance(error, OperationalError)], purge_errors
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                'ALTER TABLE weft_django_workflowclaim ALTER COLUMN workflow_id TYPE varchar(255) COLLATE "default"'
            )


def test_chunks_are_cut_by_size_as_well_as_rows() -> None:
    """2,000 inputs of 1 MiB each (PAYLOAD_MAX_BYTES allows it) made one statement past PostgreSQL's
    1 GB message limit, and the server dropped the connection."""
    from weft_django.store import runs_bulk
    from weft_django.store.runs import NewRun

    def run(index: int, size: int) -> NewRun:
        return NewRun(workflow_id=f"w{index}", workflow_type="tests.sum", version="1", input_text="x" * size)

    big = [run(i, runs_bulk.CHUNK_BYTES // 3 + 1) for i in range(7)]
    assert [len(chunk) for chunk in runs_bulk.chunks_by_input(big)] == [2, 2, 2, 1]
    small = [run(i, 10) for i in range(runs_bulk.CHUNK_ROWS * 2 + 1)]
    assert [len(chunk) for chunk in runs_bulk.chunks_by_input(small)] == [runs_bulk.CHUNK_ROWS, runs_bulk.CHUNK_ROWS, 1]
    alone = [run(0, runs_bulk.CHUNK_BYTES * 2), run(1, 10)]
    assert [len(chunk) for chunk in runs_bulk.chunks_by_input(alone)] == [1, 1]
