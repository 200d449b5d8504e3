"""The starter behind ``WorkflowDefinition.start`` (the ``fulfil_order.start(42)`` shortcut).

The registry (which the client reads) cannot import the client, so the client installs its ``start``
here when it is imported (weft_django/client/__init__.py), and ``WeftConfig.ready()`` imports the
client. ``RunHandle`` is what the shortcut returns, as a Protocol of ``WorkflowHandle``'s public
methods: mypy checks the client's ``start`` (and so WorkflowHandle) against it where it is installed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .exceptions import ConfigurationError

if TYPE_CHECKING:
    from .status import WorkflowStatus


class RunHandle(Protocol):
    """A ``weft_django.client.WorkflowHandle``: see it for what each method does."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> WorkflowStatus | str: ...

    def describe(self) -> dict[str, Any]: ...

    def signal(self, name: str, payload: Any = None, *, signal_id: str | None = None) -> None: ...

    def cancel(self, reason: str | None = None) -> None: ...

    def suspend(self) -> None: ...

    def resume(self) -> None: ...

    def retry(self) -> None: ...

    def query(self, name: str, arg: Any = ..., *, timeout: Any = "5s") -> Any: ...

    def update(
        self, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s"
    ) -> Any: ...

    def result(self, timeout: Any = None) -> Any: ...

    async def aresult(self, timeout: Any = None) -> Any: ...

    async def adescribe(self) -> dict[str, Any]: ...

    async def asignal(self, name: str, payload: Any = None, *, signal_id: str | None = None) -> None: ...

    async def acancel(self, reason: str | None = None) -> None: ...

    async def asuspend(self) -> None: ...

    async def aresume(self) -> None: ...

    async def aretry(self) -> None: ...

    async def aquery(self, name: str, arg: Any = ..., *, timeout: Any = "5s") -> Any: ...

    async def aupdate(
        self, name: str, payload: Any = None, *, idempotency_key: str | None = None, timeout: Any = "5s"
    ) -> Any: ...


class Starter(Protocol):
    """``weft.start``, as far as the shortcut calls it."""

    def __call__(
        self, workflow: Any, /, *, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> RunHandle: ...


_installed: list[Starter] = []


def install(start: Starter) -> None:
    """Make ``start`` the shortcut's starter (the client calls this once, when it is imported)."""
    _installed[:] = [start]


def starter() -> Starter:
    """The installed starter. Raises ConfigurationError when the client was never imported: Django is
    not set up, or weft_django is not in INSTALLED_APPS (``WeftConfig.ready()`` imports the client)."""
    if not _installed:
        raise ConfigurationError(
            "WorkflowDefinition.start() has no client to start with: Django is not set up, or "
            '"weft_django" is not in INSTALLED_APPS. Add "weft_django" to INSTALLED_APPS in your settings '
            "and call django.setup() first (WeftConfig.ready() imports the client)."
        )
    return _installed[0]
