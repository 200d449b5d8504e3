"""Two engines of different OWNERSHIP modes starting at once on an empty database (PostgreSQL:
threads on their own connections, released together by a barrier). The one-row mode marker is
created once: one engine records its mode, the other reads it and, its mode being another, is
refused with OwnershipModeMismatchError (no IntegrityError, no second marker, no deadlock)."""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.races import alternate, race
from weft_django.engine.ownership import check_mode_marker
from weft_django.models import OwnershipMarker
from weft_django.store.engines import reset_mode_marker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_engines_of_different_modes_starting_at_once_record_one_mode():
    winners = set()
    for round_ in range(10):
        reset_mode_marker("default")
        outcomes = race(
            lambda: check_mode_marker("engine-lease", "lease", "default"),
            lambda: check_mode_marker("engine-none", "none", "default"),
            delays=alternate(round_, 0.01),
        )
        marker = OwnershipMarker.objects.get()
        refused = [o for o in outcomes if o is not None]
        assert len(refused) == 1 and isinstance(refused[0], weft.OwnershipModeMismatchError), outcomes
        assert outcomes[("lease", "none").index(marker.mode)] is None  # the recorded mode's engine runs
        assert marker.set_by == f"engine-{marker.mode}"
        winners.add(marker.mode)
    print("recorded modes:", sorted(winners))
