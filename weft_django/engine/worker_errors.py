"""A worker's exception known only by its class names: the names a worker records for it, how a
``RetryPolicy`` judges them on the engine's side, and how a recorded value is read back."""

from __future__ import annotations

from typing import Any

from ..registry import RetryPolicy


def exception_types(exc: BaseException) -> list[str]:
    """The names a RetryPolicy's ``non_retryable`` is matched against, for every class in the MRO."""
    names: list[str] = []
    for klass in type(exc).__mro__:
        names += [klass.__name__, f"{klass.__module__}.{klass.__qualname__}"]
    return names


def is_retryable(policy: RetryPolicy, types: tuple[str, ...]) -> bool:
    """RetryPolicy.is_retryable for an exception known only by its class names (raised on a worker)."""
    return not set(policy.non_retryable) & set(types)


def recorded_types(types: Any) -> tuple[str, ...]:
    """A worker's recorded exception class names; none for a value of another shape (a hand edit)."""
    return tuple(types) if isinstance(types, list) and all(isinstance(n, str) for n in types) else ()
