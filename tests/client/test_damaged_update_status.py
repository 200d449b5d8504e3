"""``update()`` waiting for an update whose stored status is none weft writes (a hand edit): no engine
will ever settle it, so the caller is told so at once, naming the row, with weft's error for damaged
rows (CorruptPayloadError). Before, it waited out its whole timeout and raised UpdateTimeoutError
saying the update "was taken by its wait_for_update" and that respond() would still complete it:
neither was true."""

from __future__ import annotations

import pytest
from django.db import connection

import weft_django as weft
from weft_django.models import PendingUpdate, Workflow
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)
UPDATE_ID = "22222222-2222-2222-2222-222222222222"


def _update_with_status(status: str) -> None:
    now = "datetime('now')" if connection.vendor == "sqlite" else "now()"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {PendingUpdate._meta.db_table} "
            "(id, workflow_id, run_id, name, payload, idempotency_key, status, created_at) "
            f"SELECT %s, id, run_id, 'bump', '2', 'k', %s, {now} FROM {Workflow._meta.db_table} WHERE id = 'damaged'",
            [UPDATE_ID.replace("-", "") if connection.vendor == "sqlite" else UPDATE_ID, status],
        )


@pytest.mark.parametrize("status", ["bogus", ""])
def test_update_by_key_of_an_update_with_an_unknown_status_names_the_row(status):
    handle = weft.start("tests.signals", id="damaged")
    run_until_idle(timeout=15)
    _update_with_status(status)
    with pytest.raises(weft.CorruptPayloadError) as raised:  # before: UpdateTimeoutError after the timeout
        handle.update("bump", 2, idempotency_key="k", timeout=3)
    message = str(raised.value)
    assert UPDATE_ID in message and f"holds status {status!r}" in message, message
    assert "wait_for_update" not in message, message


def test_update_by_key_of_an_accepted_update_still_times_out_as_taken():
    """The known status next to it: an update a wait_for_update took (accepted) and no respond() answered."""
    handle = weft.start("tests.signals", id="damaged")
    run_until_idle(timeout=15)
    _update_with_status("accepted")
    with pytest.raises(weft.UpdateTimeoutError, match="taken by its wait_for_update"):
        handle.update("bump", 2, idempotency_key="k", timeout=1)
