"""Named prepared statements (weft_django/prepared.py): used in autocommit only, named by a digest of
their text, and every way they can go missing (a pooler, DISCARD ALL, a statement PostgreSQL cannot
prepare) ends in the plain statement, with the same rows written once."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from weft_django.models import BufferedSignal, Workflow
from weft_django.store import prepared

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@weft.workflow(name="prepared_tests.waits")
def waits(ctx, *args, **kwargs):
    yield ctx.wait_for_signal("go")


@pytest.fixture(autouse=True)
def _fresh_connection():
    """Prepared statements live as long as their connection: each test starts on a new one."""
    connection.close()
    yield
    connection.close()


def verbs(queries) -> list[str]:
    return [q["sql"].split(" ", 1)[0] for q in queries]


def executed(sql: str) -> str:
    """The name of the prepared statement an EXECUTE (alone, or pipelined: BEGIN; EXECUTE ...) runs."""
    return sql.split("EXECUTE ", 1)[1].split("(", 1)[0]


def on_server() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'weft\\_%%'")
        return {row[0] for row in cursor.fetchall()}


def numbered(sql: str, params: Any) -> tuple[str, list[Any]]:
    """The PREPARE text of ``sql`` and ``params`` in its ``$n`` order."""
    shape = prepared._shape(sql)
    return shape.text, shape.ordered(params)


def test_placeholders_are_numbered_in_order():
    assert numbered("SELECT %s, %s WHERE x LIKE 'a%%'", [1, "b"]) == (
        "SELECT $1, $2 WHERE x LIKE 'a%'",
        [1, "b"],
    )
    # Named placeholders: numbered by first appearance; a repeated name reuses its number.
    assert numbered("SELECT %(b)s, %(a)s, %(b)s", {"a": 1, "b": 2, "unused": 3}) == (
        "SELECT $1, $2, $1",
        [2, 1],
    )


def test_a_texts_shape_is_worked_out_once_and_each_call_takes_its_own_values():
    sql = "SELECT %s, %s /* test_prepared shape */"
    before = prepared._shape.cache_info()
    assert numbered(sql, [1, 2]) == ("SELECT $1, $2 /* test_prepared shape */", [1, 2])
    assert numbered(sql, (3, 4)) == ("SELECT $1, $2 /* test_prepared shape */", [3, 4])
    after = prepared._shape.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    with pytest.raises(IndexError, match="2 placeholders, 1 parameters"):
        numbered(sql, [1])
    with pytest.raises(KeyError):
        numbered("SELECT %(a)s", {"b": 1})
    with pytest.raises(TypeError, match="as a mapping"):
        numbered("SELECT %(a)s", [1])


def test_the_name_is_a_digest_of_the_text():
    assert prepared.statement_name("SELECT 1") == prepared.statement_name("SELECT 1")
    assert prepared.statement_name("SELECT 1") != prepared.statement_name("SELECT 2")
    assert prepared.statement_name("SELECT 1").startswith("weft_")


def test_autocommit_prepares_once_then_executes():
    with CaptureQueriesContext(connection) as first:
        weft.start(waits, id="p-1")
    with CaptureQueriesContext(connection) as second:
        weft.start(waits, id="p-2")
    # Each start: BEGIN, its statement, COMMIT, its wake-up, in one round trip (store.runs.NOTIFY_PIPELINED).
    assert verbs(first) == ["PREPARE", "BEGIN;"] and verbs(second) == ["BEGIN;"]
    name = executed(second[0]["sql"])
    assert name in on_server()
    assert set(Workflow.objects.values_list("id", flat=True)) == {"p-1", "p-2"}


def test_inside_a_transaction_the_plain_statement_runs():
    # A failed EXECUTE would abort the caller's transaction, so none is tried inside one.
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        weft.start(waits, id="p-atomic")
        weft.signal("p-atomic", "go", 1)
    assert not [v for v in verbs(queries) if v in ("PREPARE", "EXECUTE")]
    assert on_server() == set()
    assert BufferedSignal.objects.filter(workflow_id="p-atomic").count() == 1


def test_a_statement_gone_from_the_server_runs_plainly_and_is_prepared_again():
    weft.start(waits, id="p-a")
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a pooler's other server connection, or DISCARD ALL, looks like
    with CaptureQueriesContext(connection) as missed:
        weft.start(waits, id="p-b")
    # failed (the session's failed block rolled back), then prepared again, run and its wake-up sent
    assert verbs(missed) == ["BEGIN;", "ROLLBACK", "PREPARE", "EXECUTE", "SELECT"]
    with CaptureQueriesContext(connection) as again:
        weft.start(waits, id="p-c")
    assert verbs(again) == ["BEGIN;"]
    assert Workflow.objects.filter(id__in=["p-a", "p-b", "p-c"]).count() == 3  # each written once


def test_a_connection_that_keeps_missing_stops_preparing():
    for i in range(prepared.MAX_MISSES):
        weft.start(waits, id=f"prepared-{i}")
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
        with CaptureQueriesContext(connection) as missed:
            weft.start(waits, id=f"missed-{i}")
        last = i == prepared.MAX_MISSES - 1  # the last miss stops preparing: the plain statement
        assert verbs(missed) == ["BEGIN;", "ROLLBACK", *(["WITH"] if last else ["PREPARE", "EXECUTE"]), "SELECT"]
    with CaptureQueriesContext(connection) as queries:
        weft.start(waits, id="after")
    assert verbs(queries) == ["WITH", "SELECT"]  # no PREPARE any more on this connection
    assert Workflow.objects.count() == 2 * prepared.MAX_MISSES + 1


def test_a_statement_postgresql_cannot_prepare_runs_plainly():
    sql = "SELECT %s IS NULL"  # PREPARE cannot tell the parameter's type
    with connection.cursor() as cursor:
        prepared.execute(cursor, connection, sql, ["x"])
        assert cursor.fetchone() == (False,)
    with CaptureQueriesContext(connection) as queries, connection.cursor() as cursor:
        prepared.execute(cursor, connection, sql, ["y"])
        assert cursor.fetchone() == (False,)
    assert verbs(queries) == ["SELECT"]  # remembered: not tried again on this connection


def test_a_statement_whose_result_type_changed_is_prepared_again():
    # A migration that changes a returned column's type while the connection lives: PostgreSQL refuses
    # the old plan (0A000); the statement runs plainly and is prepared afresh next time.
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE prepared_probe (v integer)")
        cursor.execute("INSERT INTO prepared_probe VALUES (1)")
    try:
        sql = "SELECT v FROM prepared_probe WHERE v = %s"
        with connection.cursor() as cursor:
            prepared.execute(cursor, connection, sql, [1])
            assert cursor.fetchall() == [(1,)]
            cursor.execute("ALTER TABLE prepared_probe ALTER COLUMN v TYPE bigint")
        with CaptureQueriesContext(connection) as queries, connection.cursor() as cursor:
            prepared.execute(cursor, connection, sql, [1])
            assert cursor.fetchall() == [(1,)]
        assert verbs(queries) == ["EXECUTE", "DEALLOCATE", "SELECT"]
        with CaptureQueriesContext(connection) as queries, connection.cursor() as cursor:
            prepared.execute(cursor, connection, sql, [1])
            assert cursor.fetchall() == [(1,)]
        assert verbs(queries) == ["PREPARE", "EXECUTE"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE prepared_probe")


def test_an_error_of_the_statement_itself_is_raised():
    with connection.cursor() as cursor, pytest.raises(Exception, match="division by zero"):
        prepared.execute(cursor, connection, "SELECT 1 / %s", [0])


def test_the_setting_turns_it_off(settings):
    settings.WEFT = {"PREPARED_STATEMENTS": False}
    with CaptureQueriesContext(connection) as queries:
        weft.start(waits, id="off")
    assert verbs(queries) == ["WITH", "SELECT"] and on_server() == set()


def test_the_engines_one_statement_commit_is_prepared(weft_run_until_idle):
    handle = weft.start(waits, id="engine-commit")
    weft_run_until_idle()
    handle.signal("go", 7)
    weft_run_until_idle()
    assert handle.result(timeout=10) is None
    # The in-process engine's connection is this thread's: its commit statement was prepared here.
    assert any(name.startswith("weft_") for name in on_server())
