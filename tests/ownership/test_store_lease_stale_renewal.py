"""OWNERSHIP="lease": a renewal of an epoch the loop already gave up must not depose the engine again.

The renewal thread read the lease's epoch, then renewed it. When the loop's pass ran longer than the
renew interval, a second renewal read the old epoch after the first had found the lease lost; if the
loop's ``hold()`` deposed every workflow and took the lease back at a new epoch meanwhile, the stale
renewal failed and set ``lost``, and the next pass deposed every workflow again and took the lease at
yet another epoch (churn). The interleaving is forced here by running ``hold()`` inside the renewal's
statement call, on the real database."""

from __future__ import annotations

from unittest import mock

import pytest

from weft_django.conf import get_settings
from weft_django.engine.renewal import StoreLease
from weft_django.store import engines

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_stale_renewal_after_the_lease_was_taken_back_does_not_depose_again():
    engines.register_engine("sl-stale", "lease", "default")
    lease = StoreLease("sl-stale", get_settings(), "default")
    assert lease.acquire()
    old = lease.epoch
    assert old is not None
    engines.release_store_lease("sl-stale", old, "default")  # the lease went away under the engine
    assert lease.renew() is False and lease.lost  # the first renewal finds it lost

    deposed: list[int | None] = []
    real = engines.renew_store_lease

    def loop_holds_meanwhile(engine_id: str, epoch: int, **kwargs: object) -> bool:
        assert lease.hold(lambda: deposed.append(lease.epoch)) == (True, True)  # deposes, takes it back
        return real(engine_id, epoch, **kwargs)  # type: ignore[arg-type]

    with mock.patch.object(engines, "renew_store_lease", loop_holds_meanwhile):
        lease.renew()  # the second renewal read the old epoch before the loop's hold()
    new = lease.epoch
    assert deposed == [old] and new is not None and new != old
    assert lease.hold(lambda: deposed.append(lease.epoch)) == (True, False), "the lease held anew was given up"
    assert deposed == [old], f"deposed again for the stale renewal of epoch {old}: {deposed}"
    assert lease.epoch == new
    lease.release()
