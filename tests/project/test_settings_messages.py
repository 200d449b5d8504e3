"""A settings typo is reported the same way everywhere (issue 20): weft_engine gives the check id and the
"Did you mean" hint that ``manage.py check`` gives, and ``start()`` warns about it."""

from __future__ import annotations

import logging

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

import weft_django as weft
from weft_django import conf


def test_weft_engine_reports_a_typo_with_its_check_id_and_hint() -> None:
    with override_settings(WEFT={"OWNERSHP": "lease"}), pytest.raises(CommandError) as caught:
        call_command("weft_engine", "--once")
    message = str(caught.value)
    assert "weft.E013" in message
    assert "Unknown key 'OWNERSHP' in settings.WEFT." in message
    assert 'Did you mean "OWNERSHIP"?' in message


def test_weft_engine_reports_every_broken_rule() -> None:
    with override_settings(WEFT={"OWNERSHP": "lease", "POLL_INTERVAL": "soon"}), pytest.raises(CommandError) as caught:
        call_command("weft_engine", "--once")
    assert "weft.E013" in str(caught.value) and "weft.E002: POLL_INTERVAL" in str(caught.value)


@pytest.mark.django_db(transaction=True)
def test_start_warns_once_about_broken_settings(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="weft_django")
    with override_settings(WEFT={"POLL_INTERVAL": "100ms", "OWNERSHP": "lease"}):
        weft.start("tests.sum", args=[1, 2])
        weft.start("tests.sum", args=[1, 2])
    warnings = [r for r in caplog.records if r.name == "weft_django.conf"]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    text = warnings[0].getMessage()
    assert "weft.E013" in text and 'Did you mean "OWNERSHIP"?' in text and "weft_engine" in text


@pytest.mark.django_db(transaction=True)
def test_start_with_valid_settings_warns_nothing(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="weft_django")
    weft.start("tests.sum", args=[1, 2])
    assert not [r for r in caplog.records if r.name == "weft_django.conf"]
    assert conf.problems() == []
