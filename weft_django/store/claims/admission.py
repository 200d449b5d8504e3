"""The claims of admitted runs: a queue's admission (``store/queues.py``) makes the admitting engine the
holder of the runs it admitted, in the admission's transaction, after it locked them (in workflow_id
order, in one statement, before any write: ``lock_ids``)."""

from __future__ import annotations

from datetime import timedelta

from ...models import WorkflowClaim
from ..backend import backend
from ..clock import _python_now
from ..epochs import next_epoch, next_epoch_sql

CLAIM_TABLE = WorkflowClaim._meta.db_table


def _ms(delta: timedelta) -> int:
    return round(delta.total_seconds() * 1000)


def hold_admitted(engine_id: str, workflow_ids: list[str], ttl: timedelta, using: str) -> dict[str, int]:
    """Inside the admission's transaction, the claims already locked: give each unheld one a fresh epoch
    and ``engine_id`` as its holder (and last holder), runnable. Returns {workflow_id: epoch}.

    Args:
        engine_id: the admitting engine; ``workflow_ids``: the runs it admitted.
        ttl: the claims' time to live; ``using``: the connection alias.
    """
    ids = sorted(set(workflow_ids))
    if not ids:
        return {}
    found = backend(using)
    marks = ", ".join(["%s"] * len(ids))
    with found.connection.cursor() as cursor:
        if found.has_clock:
            cursor.execute(
                f"UPDATE {CLAIM_TABLE} SET epoch = {next_epoch_sql('postgresql')}, engine_id = %s, "
                f"last_engine_id = %s, claimed_at = clock_timestamp(), "
                f"expires_at = clock_timestamp() + %s * interval '1 millisecond', runnable = TRUE "
                f"WHERE engine_id IS NULL AND workflow_id IN ({marks}) RETURNING workflow_id, epoch",
                [engine_id, engine_id, _ms(ttl), *ids],
            )
            return {wid: int(epoch) for wid, epoch in cursor.fetchall()}
        held: dict[str, int] = {}
        clock = _python_now()
        for wid in ids:
            epoch = next_epoch(using)
            cursor.execute(
                f"UPDATE {CLAIM_TABLE} SET epoch = %s, engine_id = %s, last_engine_id = %s, claimed_at = %s, "
                f"expires_at = %s, runnable = %s WHERE engine_id IS NULL AND workflow_id = %s",
                [epoch, engine_id, engine_id, clock, clock + ttl, True, wid],
            )
            if cursor.rowcount == 1:
                held[wid] = epoch
        return held
