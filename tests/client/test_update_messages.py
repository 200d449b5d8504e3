"""A rejected update names the fields its validator refused (issue 20), in Python and in the CLI."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

import weft_django as weft
from weft_django.testing import owns


def test_the_message_names_each_issues_path() -> None:
    error = weft.UpdateValidationError(
        "note",
        [
            {"message": "This field is required.", "path": ["text"]},
            {"message": "Enter a valid value.", "path": ["items", 0, "qty"]},
            {"message": "rejected as a whole", "path": None},
        ],
    )
    assert str(error) == (
        'Update "note" rejected by validator: text: This field is required.; '
        "items[0].qty: Enter a valid value.; rejected as a whole"
    )


@pytest.mark.django_db(transaction=True)
def test_a_form_validators_rejection_names_the_fields_in_python_and_in_the_cli(weft_engine) -> None:
    handle = weft.start("tests.msg_counter", id="u-paths")
    owns(weft_engine, handle.id)
    with pytest.raises(weft.UpdateValidationError) as caught:
        handle.update("form_note", {"priority": 0}, timeout="10s")
    assert "text: This field is required." in str(caught.value)
    assert "priority: Ensure this value is greater than or equal to 1." in str(caught.value)
    with pytest.raises(CommandError) as cli:
        call_command(
            "weft",
            "update",
            handle.id,
            "form_note",
            "--payload",
            '{"priority": 0}',
            "--timeout",
            "10s",
            stdout=io.StringIO(),
        )
    assert "text: This field is required." in str(cli.value)


@weft.workflow(name="tests.update_messages.takes_and_ends")
def takes_and_ends(ctx: weft.WorkflowContext):  # type: ignore[no-untyped-def]
    payload, _respond = yield ctx.wait_for_update("approve")  # taken, never answered
    return {"got": payload}


@pytest.mark.django_db(transaction=True)
def test_an_update_taken_but_never_answered_says_the_workflow_took_it(weft_engine) -> None:
    handle = weft.start("tests.update_messages.takes_and_ends", id="u-taken")
    owns(weft_engine, handle.id)
    with pytest.raises(weft.WorkflowTerminalError) as caught:
        handle.update("approve", {"by": "alice"}, timeout="10s")
    message = str(caught.value)
    assert "was not applied" not in message, message
    assert 'taken by the workflow\'s wait_for_update("approve")' in message, message
    assert "ended before it answered" in message, message
    assert handle.result(timeout=10) == {"got": {"by": "alice"}}


@weft.workflow(name="tests.update_messages.takes_and_waits")
def takes_and_waits(ctx: weft.WorkflowContext):  # type: ignore[no-untyped-def]
    payload, _respond = yield ctx.wait_for_update("approve")  # taken, never answered
    yield ctx.wait_for_signal("never")
    return payload


@pytest.mark.django_db(transaction=True)
def test_an_update_taken_then_the_run_cancelled_says_the_workflow_took_it(weft_engine) -> None:
    from weft_django.models import PendingUpdate

    handle = weft.start("tests.update_messages.takes_and_waits", id="u-taken-cancel")
    owns(weft_engine, handle.id)
    with pytest.raises(weft.UpdateTimeoutError, match="taken by its wait_for_update"):
        handle.update("approve", {"by": "bob"}, timeout="1s")
    handle.cancel("changed my mind")
    row = PendingUpdate.objects.get(workflow_id=handle.id)
    assert row.status == "failed" and row.error["accepted"] is True
    assert "after its wait_for_update took this update" in row.error["message"]
