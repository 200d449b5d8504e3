"""A pass costs what it serves, not what the engine holds: a wake-up for one parked workflow, an
activity's outcome, and the quiet check after a commit do not walk every held workflow.

Before engine/attention.py, each pass walked all of them several times (attempt timeouts, mailboxes
not yet looked at, attempts to dispatch), and with 4,000 parked workflows signal -> result went from
2.2 to 4.0 ms p50 (docs/benchmarks.md, session 12). The walks are counted here, not timed: the held
workflows' dict counts every iteration over it made by the loop's thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django.engine import residency
from weft_django.engine.engine import Engine
from weft_django.engine.owned import Owned
from weft_django.models import Workflow, WorkflowClaim

from .ticking import tick_until

pytestmark = pytest.mark.django_db(transaction=True)

PARKED = 12


@weft.activity
def pass_cost_echo(value: Any) -> Any:
    return value


@weft.workflow(name="tests.pass_cost_parked")
def parked(ctx: Any) -> Any:
    value = yield ctx.wait_for_signal("go")
    return (yield ctx.run(pass_cost_echo, value))


@weft.workflow(name="tests.pass_cost_parked_with_timeout")
def parked_with_timeout(ctx: Any) -> Any:
    """Parked on a timer too: never evicted (residency keeps workflows with timers resident)."""
    value = yield ctx.wait_for_signal("go", timeout="1h")
    return (yield ctx.run(pass_cost_echo, value))


class _Walks(dict[str, Owned]):
    """The loop's held workflows, counting the walks over them made by the thread that created it."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.walks = 0

    def _count(self) -> None:
        if threading.get_ident() == self.thread:
            self.walks += 1

    def __iter__(self) -> Iterator[str]:
        self._count()
        return super().__iter__()

    def keys(self) -> Any:
        self._count()
        return super().keys()

    def values(self) -> Any:
        self._count()
        return super().values()

    def items(self) -> Any:
        self._count()
        return super().items()


def _parked_engine(engine_id: str, workflow: Any = parked) -> tuple[Engine, _Walks, list[Any]]:
    """An in-process engine holding PARKED parked workflows, its held-workflow dict counting walks."""
    handles = [weft.start(workflow, id=f"{engine_id}-{i}") for i in range(PARKED)]
    engine = Engine(engine_id, concurrency=2)
    walks = _Walks()
    engine.owned = engine.progress.owned = walks  # before anything is loaded: the loop's one dict
    engine.start()  # the listener (PostgreSQL): a signal's NOTIFY wakes a pass naming its workflow
    tick_until(
        engine,
        lambda: WorkflowClaim.objects.filter(engine_id=engine_id).count() == PARKED and len(engine.owned) == PARKED,
        "every workflow held",
    )
    for _ in range(3):  # the first passes commit the parked state and look at each new mailbox
        engine.tick()
    walks.walks = 0
    return engine, walks, handles


@override_settings(WEFT={"POLL_INTERVAL": "60s"})  # no maintenance pass (which does look at all) in the test
def test_a_quiet_pass_does_not_walk_every_held_workflow() -> None:
    engine, walks, _ = _parked_engine("pass-quiet")
    try:
        assert not engine.tick(), "a quiet pass found something to do"
        assert walks.walks == 0, "the quiet check walked every held workflow"
    finally:
        engine.shutdown()


@pytest.mark.postgres  # the wake-up comes from LISTEN (SQLite finds signals by the maintenance sweep)
@override_settings(WEFT={"POLL_INTERVAL": "60s"})
def test_the_passes_serving_one_signalled_workflow_do_not_walk_every_held_workflow() -> None:
    engine, walks, handles = _parked_engine("pass-signal")
    try:
        handles[0].signal("go", "one")  # a wake-up naming one workflow; its activity; its end
        tick_until(
            engine,
            lambda: Workflow.objects.filter(pk=handles[0].id, status="completed").exists(),
            "the signalled workflow's end",
        )
        assert handles[0].result(timeout=5) == "one"
        assert walks.walks == 0, f"the passes serving one workflow walked every held one {walks.walks} times"
        assert len(engine.owned) == PARKED - 1
    finally:
        engine.shutdown()


@pytest.mark.postgres
@override_settings(WEFT={"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 2})
def test_an_engine_held_over_its_resident_limit_by_workflows_it_cannot_evict_does_not_scan_them_every_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(residency, "SHORT_SCAN_RETRY", 3600.0)  # the scan that came up short is not retried
    engine, walks, handles = _parked_engine("pass-evict", parked_with_timeout)
    try:
        assert len(engine.owned) == PARKED and engine.residency.evictions == 0  # each has a timer: none evictable
        handles[0].signal("go", "one")
        tick_until(
            engine,
            lambda: Workflow.objects.filter(pk=handles[0].id, status="completed").exists(),
            "the signalled workflow's end",
        )
        assert walks.walks == 0, f"the passes walked every held workflow {walks.walks} times (eviction scans)"
    finally:
        engine.shutdown()
