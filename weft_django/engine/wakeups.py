"""The listening side of wake-ups: LISTEN on a dedicated connection (``store/listen.py``, outside
Django's connection handling), re-LISTEN and ask for a full rescan after it drops. Polling covers everything
else (and is the only path on SQLite)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..store.listen import listening

logger = logging.getLogger(__name__)


class Listener(threading.Thread):
    def __init__(self, using: str, on_notify: Callable[[str | None], None], stop: threading.Event) -> None:
        super().__init__(name="weft-listen", daemon=True)
        self._using = using
        self._on_notify = on_notify  # called with the payload, or None for "rescan everything"
        self._halt = stop
        self.connected = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._listen()
            except Exception as exc:
                logger.warning("listener connection lost, reconnecting error=%s", exc)
                self.connected.clear()
                self._on_notify(None)
                self._halt.wait(1.0)

    def _listen(self) -> None:
        with listening(self._using) as conn:
            self.connected.set()
            self._on_notify(None)  # anything sent while we were not listening
            while not self._halt.is_set():
                for notify in conn.notifies(timeout=0.5):
                    self._on_notify(notify.payload)
