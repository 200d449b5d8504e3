"""Procrastinate peer: three chained jobs (each job defers the next), the same shape as bench.three_noop.

Database ``weft_peer_procrastinate`` (WEFT_BENCH_PG_* for the server). Worker:
``procrastinate --app=benchmarks.peer_apps.procrastinate_app.app worker --concurrency 8``.
"""

from __future__ import annotations

import procrastinate

from benchmarks.peer_apps import common

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=common.conninfo(common.DATABASES["procrastinate"])),
)


@app.task(name="bench.step", queue="bench")
async def step(i: int, k: int) -> int:
    """Step k of chain i: no work, then defer step k+1 (the last is k=3)."""
    if k < 3:
        await step.defer_async(i=i, k=k + 1)
    return i
