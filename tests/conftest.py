"""Marker rules for the two database runs (WEFT_TEST_DB=postgres | sqlite)."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
