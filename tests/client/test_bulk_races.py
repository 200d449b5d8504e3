"""Bulk operations and forks racing each other on the same runs (PostgreSQL: threads on their own
connections, released together by a barrier).

Two operators running the same bulk cancel or purge at once, or two forks to one new id from two
sources: every run is changed once (the two results' counts add up to the selection, the rest are
reported skipped), the second fork gets WorkflowAlreadyExistsError and writes nothing, and no
IntegrityError, deadlock or hang reaches the caller.
"""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.races import alternate, errors, race
from weft_django.models import Workflow, WorkflowClaim

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
RUNS = 30


def _started(prefix: str) -> list[str]:
    handles = weft.start_many([weft.StartRequest("tests.signals", id=f"{prefix}-{i:02}") for i in range(RUNS)])
    return [handle.id for handle in handles]


@pytest.mark.parametrize("batch_size", [1, 7])
def test_two_bulk_cancels_of_one_selection_cancel_each_run_once(batch_size):
    ids = _started(f"bc{batch_size}")
    prefix = ids[0].rsplit("-", 1)[0]
    count = weft.bulk_count("cancel", id_prefix=prefix)
    assert count == RUNS

    def cancel():
        return weft.bulk_cancel(expected_count=count, reason="race", batch_size=batch_size, id_prefix=prefix)

    first, second = race(cancel, cancel)
    assert errors([first, second]) == [], (first, second)
    assert first.errors == second.errors == {}
    assert first.changed + second.changed == RUNS, (first, second)
    # a run the other one cancelled first is skipped, or not read at all (no longer active)
    assert set(first.skipped) | set(second.skipped) <= set(ids)
    assert set(Workflow.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"cancelled"}
    assert set(Workflow.objects.filter(pk__in=ids).values_list("cancel_reason", flat=True)) == {"race"}


def test_two_bulk_purges_of_one_selection_purge_each_run_once():
    ids = _started("bp")
    for workflow_id in ids:
        weft.cancel(workflow_id)
    count = weft.bulk_count("purge", id_prefix="bp-")
    assert count == RUNS

    def purge():
        return weft.bulk_purge(expected_count=count, batch_size=8, id_prefix="bp-")

    first, second = race(purge, purge)
    assert errors([first, second]) == [], (first, second)
    assert first.changed + second.changed == RUNS, (first, second)
    assert not Workflow.objects.filter(pk__in=ids).exists()
    assert not WorkflowClaim.objects.filter(pk__in=ids).exists()


def test_two_forks_to_one_new_id_from_two_sources_start_one_run():
    seen = set()
    for round_ in range(8):
        a = weft.start("tests.sum", args=[1, 2], id=f"fk-a-{round_}")
        b = weft.start("tests.sum", args=[3, 4], id=f"fk-b-{round_}")
        target = f"fk-new-{round_}"
        from_a, from_b = race(
            lambda a=a, target=target: weft.fork(a.id, from_step=0, new_id=target),
            lambda b=b, target=target: weft.fork(b.id, from_step=0, new_id=target),
            delays=alternate(round_, 0.02),
        )
        won = [o for o in (from_a, from_b) if isinstance(o, weft.WorkflowHandle)]
        lost = [o for o in (from_a, from_b) if not isinstance(o, weft.WorkflowHandle)]
        assert len(won) == 1 and len(lost) == 1, (from_a, from_b)
        assert isinstance(lost[0], weft.WorkflowAlreadyExistsError), lost
        winner = a if won[0] is from_a else b
        seen.add(winner.id.split("-")[1])
        row = Workflow.objects.get(pk=target)
        assert row.input == Workflow.objects.get(pk=winner.id).input  # the winner's run, not a mix
        assert WorkflowClaim.objects.filter(pk=target).count() == 1
    print("fork winners:", sorted(seen))
