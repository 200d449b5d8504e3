"""The indexes the migrations leave (PostgreSQL): every index is written on every insert and on every
update that is not HOT, so weft keeps only those its queries use (migration 0016, ADR 0013)."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _indexes() -> dict[str, list[tuple[str, str, str]]]:
    """{table: [(index, its first column, its first column's operator class)]} of weft's tables."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.relname, i.relname, a.attname, o.opcname FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0] "
            "JOIN pg_opclass o ON o.oid = x.indclass[0] "
            "WHERE t.relnamespace = current_schema()::regnamespace AND t.relname LIKE 'weft\\_django\\_%%'"
        )
        found: dict[str, list[tuple[str, str, str]]] = {}
        for table, index, column, opclass in cursor.fetchall():
            found.setdefault(table, []).append((index, column, opclass))
    return found


def test_prefix_search_indexes_only_where_a_query_searches_by_prefix() -> None:
    pattern = {
        (table, column)
        for table, indexes in _indexes().items()
        for _, column, opclass in indexes
        if opclass in ("varchar_pattern_ops", "text_pattern_ops")
    }
    # weft.list_workflows(id_prefix=...) is the one prefix search (store/visibility.py).
    assert pattern == {("weft_django_workflow", "id")}


def test_timer_workflow_lookups_use_the_composite_index() -> None:
    timers = _indexes()["weft_django_timer"]
    assert [name for name, column, _ in timers if column == "workflow_id"] == ["weft_timer_wf"]
