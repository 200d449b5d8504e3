"""The engine's LISTEN connection: a dedicated psycopg connection outside Django's connection
handling, in autocommit, listening on the wake-up channel (``weft_django.notify.CHANNEL``). Only
where ``backend(using).listens`` (PostgreSQL); engines elsewhere poll."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from .backend import backend
from .notify import CHANNEL


@contextmanager
def listening(using: str) -> Iterator[psycopg.Connection]:
    """Open a new connection with the settings of alias ``using`` and LISTEN on the wake-up channel;
    close it on exit. Read notifications with ``connection.notifies(timeout=...)``.

    Args:
        using: the connection alias whose settings the connection copies.

    Raises:
        psycopg.Error: the connection or the LISTEN failed.
    """
    params = backend(using).connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield conn
