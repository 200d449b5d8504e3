"""One big workflow: does its cost grow with its size, or with its size squared? Each shape is run at
each size by an engine in THIS process (ticked in a loop, as ``benchmarks.pass_profile``), and the
table gives the seconds from the engine's first pass to the workflow's end, and the seconds per step.
A cost that grows linearly keeps its seconds per step as the size grows; a quadratic one multiplies
it by the size's factor. Work on the engine loop's thread stalls every other workflow of the engine.

    PYTHONPATH=$PWD python -m benchmarks.workflow_scale [--sizes 1000,4000,16000]
        [--shapes memos,fan_out_local,fan_out,signals,children]

Shapes (benchmarks/benchapp/workflows.py): ``memos`` (a history of n memo steps, recorded live, then
replayed in memory as a takeover or ``weft replay`` would: the "replay" column), ``fan_out_local``
(one ctx.all of n local activities), ``fan_out`` (one ctx.all of n activities on the engine's
threads), ``signals`` (n signals buffered, then consumed one wait at a time), ``children`` (one ctx.all
of n child workflows, each returning at once, run by the same engine). Database
``<WEFT_BENCH_PG_NAME or weft_workflow_scale>`` (dropped and re-created).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,4000,16000")
    parser.add_argument("--shapes", default="memos,fan_out_local,fan_out,signals,children")
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    os.environ.setdefault("WEFT_BENCH_PG_NAME", "weft_workflow_scale")
    from benchmarks.harness import recreate_database

    recreate_database()  # the settings' database, dropped and created again
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    sizes = [int(size) for size in options.sizes.split(",")]
    rows = []
    for shape in options.shapes.split(","):
        for n in sizes:
            seconds, replay = _one(shape, n)
            rows.append((shape, n, seconds, replay))
            print(f"  {shape} n={n}: {seconds:.2f} s", flush=True)
    commit = os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip() or "?"
    print(
        f"\ndate {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; "
        f"{platform.python_version()}; code {commit}"
    )
    print("| shape | n | run s | ms per step | replay s |")
    print("|---|---|---|---|---|")
    for shape, n, seconds, replay in rows:
        shown = f"{replay:.2f}" if replay is not None else ""
        print(f"| {shape} | {n:,} | {seconds:.2f} | {seconds * 1000 / n:.3f} | {shown} |")


def _one(shape: str, n: int) -> tuple[float, float | None]:
    import logging

    import weft_django as weft
    from benchmarks.benchapp import workflows
    from weft_django.engine.engine import Engine
    from weft_django.engine.replayer import replay
    from weft_django.models import Workflow
    from weft_django.store import replay as stored

    logging.getLogger("weft_django.engine.engine").setLevel(logging.ERROR)  # the long-history warning
    workflow: Any = {
        "memos": workflows.memos,
        "fan_out_local": workflows.fan_out_local,
        "fan_out": workflows.fan_out,
        "signals": workflows.signal_sum,
        "children": workflows.children,
    }[shape]
    engine = Engine(f"scale-{shape}-{n}", concurrency=8)
    engine.start()
    try:
        handle = weft.start(workflow, args=[n])
        if shape == "signals":
            for _ in range(n):
                handle.signal("add", 1)
        started = time.perf_counter()
        ticks = 0
        while not Workflow.objects.filter(id=handle.id).exclude(status="running").exists():
            if not engine.tick():
                engine._wait(0.001)  # an idle pass: activities still running on the engine's threads
            ticks += 1
        seconds = time.perf_counter() - started
        status = Workflow.objects.get(id=handle.id).status
        assert status == "completed", f"{shape} n={n} ended {status}"
    finally:
        engine.shutdown()
    if shape != "memos":
        return seconds, None
    history = stored.one(handle.id, "default")
    assert history is not None
    started = time.perf_counter()
    outcome = replay(history)
    assert outcome.ok, outcome.message
    return seconds, time.perf_counter() - started


if __name__ == "__main__":
    main()
