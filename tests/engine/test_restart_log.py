"""An engine restarted with the same --engine-id after kill -9 says why it waits (issue 20): its dead
predecessor's claims are held until they expire plus the takeover grace, and a line says until when."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

import weft_django as weft
from weft_django.models import WorkflowClaim
from weft_django.testing import running_engine, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_restart_under_the_same_id_logs_when_it_takes_its_old_claims_over(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="weft_django")
    handle = weft.start("tests.sum", args=[1, 2])
    expires = timezone.now() + timedelta(seconds=30)
    WorkflowClaim.objects.filter(pk=handle.id).update(
        engine_id="restart-1", epoch=7, claimed_at=timezone.now(), expires_at=expires
    )
    with running_engine(engine_id="restart-1"):
        wait_for(lambda: any("previous process" in m for m in _messages(caplog)), timeout=10, message="the line")
    (line,) = [m for m in _messages(caplog) if "previous process" in m]
    assert "engine=restart-1" in line and "claims=1" in line
    assert "takeover_at=" in line and "expires_at=" in line
    assert "kill -9" in line


def test_a_clean_start_logs_nothing_about_old_claims(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="weft_django")
    weft.start("tests.sum", args=[1, 2])
    with running_engine(engine_id="restart-2"):
        pass
    assert not [m for m in _messages(caplog) if "previous process" in m]
