"""Marker rules for the two database runs (WEFT_TEST_DB=postgres | sqlite)."""

from __future__ import annotations

import os
import zlib

import pytest


def _in_shard(item: pytest.Item, shard: int, shards: int) -> bool:
    """Whether ``item``'s file belongs to this shard (scripts/test runs the PostgreSQL run as shards at
    the same time): a file's tests stay together, so its module fixtures are set up once."""
    return zlib.crc32(item.nodeid.split("::", 1)[0].encode()) % shards == shard


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sharding = os.environ.get("WEFT_TEST_SHARD", "")
    if sharding:  # "k/n": keep the files of shard k (0-based) of n
        shard, shards = (int(part) for part in sharding.split("/"))
        kept = [item for item in items if _in_shard(item, shard, shards)]
        config.hook.pytest_deselected(items=[item for item in items if not _in_shard(item, shard, shards)])
        items[:] = kept
    database = os.environ.get("WEFT_TEST_DB", "postgres")
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL (this is the SQLite run)")
    skip_sqlite = pytest.mark.skip(reason="SQLite-only (this is the PostgreSQL run)")
    for item in items:
        if database == "sqlite" and "postgres" in item.keywords:
            item.add_marker(skip_pg)
        if database != "sqlite" and "sqlite" in item.keywords:
            item.add_marker(skip_sqlite)


@pytest.fixture(autouse=True, scope="session")
def _close_client_connections() -> object:
    """Waiting calls keep their own connections (threads, LISTEN); close them before the test
    database is dropped."""
    yield
    try:
        from weft_django import client

        closer = getattr(client, "close_connections", None)
        if closer is not None:
            closer()
    except Exception:
        pass


def pytest_configure(config: pytest.Config) -> None:
    """On PostgreSQL, the flush between transactional tests deletes rows instead of truncating.

    Django's flush TRUNCATEs every table (about 0.12 s here: each table gets a new file), and some 700
    tests flush; DELETE of the few rows a test leaves takes milliseconds. Django creates PostgreSQL
    foreign keys DEFERRABLE INITIALLY DEFERRED and runs the flush in one transaction, so the order of
    the DELETEs does not matter. A flush that resets sequences or cascades keeps Django's own SQL.
    """
    if os.environ.get("WEFT_TEST_DB", "postgres") != "postgres":
        return
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(
        self: DatabaseOperations,
        style: object,
        tables: list[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        if reset_sequences or allow_cascade or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"DELETE FROM {self.quote_name(table)};" for table in tables]

    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]
