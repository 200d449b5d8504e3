"""A rate's period must be a usable window (PostgreSQL and SQLite): one shorter than a microsecond
became a zero window (the rate silently never refused anything), and one too long for the clock
(``now - period`` before year 1) passed the settings checks and then failed every engine pass
(OverflowError in the admission), stopping every queue and every run; a longer one still raised
OverflowError from the checks and from ``@weft.activity(rate=)``. Now each is refused as a bad rate."""

from __future__ import annotations

import pytest
from django.test import override_settings

import weft_django as weft
from weft_django import conf
from weft_django.flow import FlowValueError, parse_rate
from weft_django.models import Workflow

BAD_RATES = ["1/0.0000001s", (1, 1e-9), "1/9999999d", "1/99999999999d", (1, float("inf")), (1, 1e20)]


@pytest.mark.parametrize("rate", BAD_RATES, ids=repr)
def test_a_period_that_is_no_usable_window_is_not_a_rate(rate):
    with pytest.raises(FlowValueError, match="period"):
        parse_rate(rate)


def test_the_longest_and_shortest_usable_periods_parse():
    assert parse_rate("7/d").period.total_seconds() == 86400
    assert parse_rate("1/36500d").period.days == 36500
    assert parse_rate((1, 0.000001)).period.microseconds == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("rate", ["1/9999999d", "1/99999999999d", "1/0.0000001s"])
def test_a_queue_rate_without_a_usable_window_is_a_settings_error(rate):
    with override_settings(WEFT={"QUEUES": {"q": {"rate": rate}, "other": {}}}):
        assert "weft.E031" in [problem.id for problem in conf.problems()]
        with pytest.raises(weft.ConfigurationError):
            weft.start("tests.queued", queue="other")
    assert not Workflow.objects.exists()


@pytest.mark.parametrize("rate", ["1/99999999999d", "1/0.0000001s"])
def test_an_activity_rate_without_a_usable_window_is_a_definition_error(rate):
    with pytest.raises(weft.WorkflowDefinitionError, match="period"):

        @weft.activity(name="tests.bad_rate_period", rate=rate)
        def bad() -> None: ...

    from weft_django.registry import registry

    assert "tests.bad_rate_period" not in registry.activities
