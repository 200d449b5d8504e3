"""The chaos suite's opt-in marker and its private PostgreSQL cluster.

Tests marked ``chaos_full`` (the long run, with PostgreSQL restarts) are deselected unless asked for:
``pytest -m chaos_full tests/chaos``, ``WEFT_CHAOS_LONG=1`` or ``WEFT_CHAOS_FULL=1``. The bounded variant runs
in the normal suite.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

OPT_IN = "chaos_full"


def opted_in(config: pytest.Config) -> bool:
    expression = str(config.getoption("-m") or "")
    asked = OPT_IN in expression and f"not {OPT_IN}" not in expression
    return asked or "1" in (os.environ.get("WEFT_CHAOS_FULL"), os.environ.get("WEFT_CHAOS_LONG"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if opted_in(config):
        return
    deselected = [item for item in items if OPT_IN in item.keywords]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if OPT_IN not in item.keywords]


@pytest.fixture
def private_postgres(django_db_blocker: Any) -> Iterator[Any]:
    """A fresh PostgreSQL cluster on a free port (tests/chaos/cluster.py), migrated, with this process's
    ``default`` connection pointed at it for the test (engines get the same settings by environment).
    Never the machine's shared server; removed afterwards."""
    import psycopg
    from django.core.management import call_command
    from django.db import connections

    from tests.chaos.cluster import PrivateCluster, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = PrivateCluster.create()
    targets = {id(connections.settings["default"]): connections.settings["default"]}
    targets[id(connections["default"].settings_dict)] = connections["default"].settings_dict
    saved = [(target, {k: target.get(k) for k in ("HOST", "PORT", "NAME", "USER")}) for target in targets.values()]
    try:
        with psycopg.connect(
            host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="postgres", autocommit=True
        ) as admin:
            admin.execute("CREATE DATABASE weft_chaos")
        with django_db_blocker.unblock():
            connections.close_all()
            for target, _ in saved:
                target.update(HOST="127.0.0.1", PORT=str(cluster.port), NAME="weft_chaos", USER=cluster.user)
            try:
                call_command("migrate", interactive=False, verbosity=0)
                yield cluster
            finally:
                from weft_django import client

                client.close_connections()
                connections.close_all()
                for target, values in saved:
                    target.update(values)
    finally:
        if os.environ.get("WEFT_CHAOS_KEEP_CLUSTER") == "1":  # to look at the tables after a failure
            print(f"\nprivate cluster kept: psql -h 127.0.0.1 -p {cluster.port} -U postgres weft_chaos")
        else:
            cluster.destroy()
