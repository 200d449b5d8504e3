"""RetryPolicy.backoff at the edges: the documented wait ``min(initial_backoff *
backoff_multiplier**(k-1), max_backoff)`` for every attempt number (a helper's review, rev15)."""

from __future__ import annotations

from datetime import timedelta

import pytest

import weft_django as weft


@pytest.mark.parametrize("failed_attempt", [1, 2, 1024, 1025, 1100, 10**6])
def test_a_zero_initial_backoff_never_waits(failed_attempt: int) -> None:
    """0 * multiplier**(k-1) is 0 however large k is: the float power overflowing (2.0**1024) or
    becoming inf made it max_backoff (0 * inf is NaN), a 30 s wait after ~1,000 instant retries."""
    policy = weft.RetryPolicy(max_attempts=10**7, initial_backoff="0s", max_backoff="30s")
    assert policy.backoff(failed_attempt) == timedelta(0)


@pytest.mark.parametrize("failed_attempt", [1, 2, 10**6])
def test_a_max_backoff_below_the_initial_one_caps_every_wait(failed_attempt: int) -> None:
    policy = weft.RetryPolicy(max_attempts=10**7, initial_backoff="10s", max_backoff="1s")
    assert policy.backoff(failed_attempt) == timedelta(seconds=1)


@pytest.mark.parametrize("failed_attempt", [1, 2, 10**20])
def test_a_multiplier_of_one_waits_the_initial_backoff(failed_attempt: int) -> None:
    policy = weft.RetryPolicy(max_attempts=10**7, initial_backoff="2s", backoff_multiplier=1)
    assert policy.backoff(failed_attempt) == timedelta(seconds=2)


@pytest.mark.parametrize("failed_attempt", [200, 10**20])
def test_a_huge_attempt_number_waits_max_backoff(failed_attempt: int) -> None:
    policy = weft.RetryPolicy(max_attempts=10**7, initial_backoff="1ms", backoff_multiplier=1000, max_backoff="1h")
    assert policy.backoff(failed_attempt) == timedelta(hours=1)
