"""The replay check's cost (issue 18): ``manage.py weft replay`` over N stored histories (not a test).

    python -m benchmarks.replay_check [--histories 10000] [--steps 6] [--rounds 2]

Drops and re-creates the PostgreSQL database ``weft_bench_replay`` (WEFT_BENCH_REPLAY_DB), writes N
runs of ``bench.replay`` (``--steps`` completed activity steps each, parked on a signal: what an
engine would replay) straight into the tables, then times ``weft replay`` over all of them (each
round: the whole check, read-only pages of 500 runs, the replay in memory). Prints a table and writes
``benchmarks/results/<timestamp>-replay.json``. No peer has the equivalent (DBOS does not replay
workflow code; Temporal's replayer is not installed here), so no ratio is reported.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import platform
import time
import uuid
from pathlib import Path
from typing import Any

DB_NAME = os.environ.get("WEFT_BENCH_REPLAY_DB", "weft_bench_replay")
os.environ["WEFT_BENCH_PG_NAME"] = DB_NAME
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
RESULTS = Path(__file__).resolve().parent / "results"


def register(steps: int) -> None:
    import weft_django as weft

    @weft.activity(name="bench.replay.step")
    def step(i: int) -> int:
        return i

    @weft.workflow(name="bench.replay")
    def bench_replay(ctx: Any, key: str) -> Any:
        total = 0
        for i in range(steps):
            total += yield ctx.run(step, i)
        token = ctx.uuid4()
        yield ctx.wait_for_signal("go")
        return [key, total, str(token)]


def populate(histories: int, steps: int) -> None:
    from django.db import transaction

    from weft_django.codec import encode_payload
    from weft_django.models import Step, Workflow

    now = dt.datetime.now(dt.UTC)
    for start in range(0, histories, 1000):
        with transaction.atomic():
            runs = []
            rows = []
            for n in range(start, min(start + 1000, histories)):
                run_id = uuid.uuid4()
                runs.append(
                    Workflow(
                        id=f"replay-{n:06d}",
                        run_id=run_id,
                        workflow_type="bench.replay",
                        status="running",
                        input=encode_payload({"args": [f"k{n}"], "kwargs": {}}),
                        created_at=now,
                        updated_at=now,
                        started_at=now,
                    )
                )
                rows += [
                    Step(
                        workflow_id=f"replay-{n:06d}",
                        run_id=run_id,
                        seq=i,
                        kind="activity",
                        name="bench.replay.step",
                        status="completed",
                        result=encode_payload(i),
                        attempts=1,
                        epoch=1,
                        started_at=now,
                        completed_at=now,
                    )
                    for i in range(steps)
                ]
            Workflow.objects.bulk_create(runs)
            Step.objects.bulk_create(rows, batch_size=5000)


def recreate_database() -> None:
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    with psycopg.connect(dbname="postgres", user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{DB_NAME}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--histories", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command

    recreate_database()
    call_command("migrate", verbosity=0)
    register(options.steps)
    began = time.monotonic()
    populate(options.histories, options.steps)
    written = time.monotonic() - began
    rounds = []
    for _ in range(options.rounds):
        out = io.StringIO()
        began = time.monotonic()
        call_command("weft", "replay", "--json", stdout=out)
        seconds = time.monotonic() - began
        report = json.loads(out.getvalue())
        assert report["replayed"] == options.histories and not report["failed"], report
        rounds.append(seconds)
    best = min(rounds)
    result = {
        "histories": options.histories,
        "steps_per_history": options.steps,
        "rounds_s": [round(s, 3) for s in rounds],
        "best_s": round(best, 3),
        "histories_per_s": round(options.histories / best),
        "ms_per_history": round(1000 * best / options.histories, 3),
        "populate_s": round(written, 1),
        "python": platform.python_version(),
    }
    print(f"{'histories':>10} {'steps':>6} {'best s':>8} {'hist/s':>8} {'ms/hist':>8}  rounds")
    print(
        f"{result['histories']:>10} {result['steps_per_history']:>6} {result['best_s']:>8} "
        f"{result['histories_per_s']:>8} {result['ms_per_history']:>8}  {result['rounds_s']}"
    )
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"{stamp}-replay.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
