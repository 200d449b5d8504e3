"""Celery peer: a chain of three no-op tasks over Redis (broker and result backend: WEFT_BENCH_REDIS_URL,
default redis://127.0.0.1:6379/11, flushed by each run).

Worker: ``celery -A benchmarks.peer_apps.celery_app worker -c 8 --loglevel WARNING`` (prefork, 8 processes).
"""

from __future__ import annotations

from celery import Celery, chain

from benchmarks.peer_apps.common import REDIS_URL

app = Celery("weft_peer_bench", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_expires=3600,
)


@app.task(name="bench.noop")
def noop(i: int) -> int:
    return i


def three_noop(n: int):  # type: ignore[no-untyped-def]
    """The same shape as bench.three_noop: noop(n) -> noop(+1) -> noop(+1), each a task."""
    return chain(noop.s(n), add_one.s(), add_one.s())


@app.task(name="bench.add_one")
def add_one(i: int) -> int:
    return i + 1
