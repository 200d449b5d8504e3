"""Every public exception is importable from ``weft_django`` and documented in docs/errors.md."""

from __future__ import annotations

import inspect
from pathlib import Path

import weft_django
from weft_django import exceptions, waits

DOC = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()


def _public_errors() -> list[type[BaseException]]:
    found = []
    for module in (exceptions, waits):
        for name, value in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(value, exceptions.WeftError)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found.append(value)
    return found


def test_every_weft_error_is_importable_from_the_package() -> None:
    missing = [cls.__name__ for cls in _public_errors() if getattr(weft_django, cls.__name__, None) is not cls]
    assert missing == []
    assert {cls.__name__ for cls in _public_errors()} <= set(weft_django.__all__)


def test_every_weft_error_is_documented() -> None:
    undocumented = [cls.__name__ for cls in _public_errors() if f"`{cls.__name__}`" not in DOC]
    assert undocumented == []


def test_every_weft_error_has_a_docstring() -> None:
    assert [cls.__name__ for cls in _public_errors() if not (cls.__doc__ or "").strip()] == []
