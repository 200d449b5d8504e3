"""EngineHost: what the engine's mailbox (messages.py) and its chores (periodic.py, residency.py,
retention.py, schedules.py, sweeps.py) use of the loop that calls them.

``Engine`` (engine.py) is the one host; it imports those modules, so they name this Protocol rather
than the class. Every member is one of Engine's, with its type; mypy checks that Engine satisfies it
wherever the loop passes itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from ..conf import WeftSettings
from ..store.commit import WorkflowWrites
from .attention import Attention
from .owned import Owned
from .wake import Wake


class ResidencyHost(Protocol):
    """What the host's ``residency`` (engine/residency.py's Residency) offers through it."""

    def recall(
        self, engine: EngineHost, workflow_ids: Iterable[str], lost: Mapping[str, int] | None = None
    ) -> dict[str, int]: ...

    def interval(self, engine: EngineHost) -> float: ...

    def sweep(self, engine: EngineHost, now: datetime) -> bool: ...


class EngineHost(Protocol):
    """The loop as its mailbox and chores see it: its id, settings and database, the live contexts,
    the commit of a pass's writes, and the wake-up state (the parts' state under the loop's names)."""

    settings: WeftSettings
    using: str
    engine_id: str
    owned: dict[str, Owned]
    attention: Attention
    wake: Wake
    _carried: dict[str, WorkflowWrites]
    _reload: dict[str, int]
    _lock: threading.Lock
    _wake: threading.Event
    _lost: dict[str, int]
    _queries_waiting: bool

    @property
    def residency(self) -> ResidencyHost: ...

    def flush(self, workflow_ids: set[str], now: datetime, writes: dict[str, WorkflowWrites]) -> None: ...

    def durable(self, workflow_id: str, writes: dict[str, WorkflowWrites]) -> bool: ...

    def answer_query(self, workflow_id: str, name: str, *args: Any) -> Any: ...

    def _drop(self, wid: str, reason: str | None) -> None: ...

    def _recheck_wait_until(
        self, owned: Owned, now: datetime, writes: dict[str, WorkflowWrites], changed: set[str]
    ) -> None: ...
