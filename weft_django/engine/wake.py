"""What wakes the engine loop and what the wake-ups named: NOTIFY payloads (the listener thread),
lost claims (the renewal thread, a refused settlement), and workflows whose mailbox the next pass
looks at. Shared by the loop and its threads under one lock."""

from __future__ import annotations

import threading

from ..store.notify import BufferedRow, parse_signal


class Wake:
    """The loop's wake-up event and what arrived with the wake-ups since the last pass.

    Args:
        engine_id: the engine (a ``q:<engine id>`` payload addresses query requests to it).
    """

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.notified: set[str] = set()  # workflows a wake-up named (w:, look_at): their mailbox is read
        self.looks: set[str] = set()  # workflows a newly armed wait names (look_for_signal)
        # Signals S: wake-ups carried, by workflow id, in the order they arrived (their commit order).
        self.carried: dict[str, list[BufferedRow]] = {}
        self.rescan = True  # look at everything (a new or reconnected listener, a ":*" wake-up)
        # Workflows whose claim renewal (or a settlement) found gone, with the epoch found gone: the loop
        # may have claimed one again at a new epoch since, which such a report is no loss of.
        self.lost: dict[str, int] = {}
        self.queries_waiting = True  # a "q:<engine id>" wake-up: query requests addressed to us
        # Wake-ups so far: a pass compares it with its own start to tell one that arrived during the pass
        # from one it served already (``event`` stays set until the loop's next idle wait).
        self.arrivals = 0

    def up(self) -> None:
        """Wake the loop."""
        self._arrived()

    def _arrived(self) -> None:
        self.arrivals += 1
        self.event.set()

    def wait(self, timeout: float) -> None:
        """Sleep until woken or ``timeout`` seconds passed; the wake-up is consumed."""
        self.event.wait(timeout)
        self.event.clear()

    def on_notify(self, payload: str | None) -> None:
        """A NOTIFY payload (None: the listener (re)connected, wake-ups may have been missed)."""
        signal = payload is not None and payload.startswith("S:")
        row = parse_signal(payload[2:]) if signal and payload is not None else None  # (outside the lock)
        with self.lock:
            if payload is None or payload.endswith(":*"):
                self.rescan = True
            elif payload.startswith("w:"):
                self.notified.add(payload[2:])
            elif signal:
                if row is None:  # not ours to read: look at every mailbox
                    self.rescan = True
                else:
                    self.carried.setdefault(row[1], []).append(row)
            elif payload == f"q:{self.engine_id}":
                self.queries_waiting = True
            else:
                return
        self._arrived()

    def look_at(self, workflow_id: str, *, wake: bool = True) -> None:
        """Have the next pass read this workflow's mailbox, signals and admitted updates (and wake the
        loop, unless ``wake`` is off)."""
        with self.lock:
            self.notified.add(workflow_id)
        if wake:
            self._arrived()

    def look_for_signal(self, workflow_id: str, *, wake: bool = True) -> None:
        """Have the next pass look for a buffered signal of this workflow (a wait was armed): in its
        known mailbox if it has one (engine/signal_delivery.py), else by a read."""
        with self.lock:
            self.looks.add(workflow_id)
        if wake:
            self._arrived()

    def pending(self, workflow_id: str) -> bool:
        """Whether a wake-up naming this workflow waits for the next pass (a ``w:``, a look, an ``S:``)."""
        with self.lock:
            return workflow_id in self.notified or workflow_id in self.looks or workflow_id in self.carried

    def unnoted(self, workflow_id: str) -> bool:
        """Whether a wake-up the next pass must note first names this workflow: a ``w:`` or ``look_at``
        (its mailbox is read), an ``S:`` row (it joins or voids the known mailbox), or a rescan."""
        with self.lock:
            return self.rescan or workflow_id in self.notified or workflow_id in self.carried

    def report_lost(self, lost: dict[str, int]) -> None:
        """These workflows' claims are gone at these epochs: the next pass stops driving the contexts
        still at them."""
        with self.lock:
            self.lost.update(lost)
        self._arrived()

    def gone(self, workflow_id: str, epoch: int) -> bool:
        """Whether this workflow's claim was reported lost at ``epoch`` since the pass began (the loop
        stops driving it now: the next pass drops it)."""
        return self.lost.get(workflow_id) == epoch  # one read of a dict: no lock needed

    def take(self) -> tuple[dict[str, int], set[str], bool, dict[str, list[BufferedRow]], set[str]]:
        """What arrived since the last pass, cleared: (lost claims, every workflow named, rescan, the
        signals ``S:`` wake-ups carried by workflow id, the workflows whose mailbox must be read: a
        ``w:`` or ``look_at`` named them)."""
        with self.lock:
            lost, self.lost = self.lost, {}
            read, self.notified = self.notified, set()
            looks, self.looks = self.looks, set()
            carried, self.carried = self.carried, {}
            rescan, self.rescan = self.rescan, False
        return lost, read | looks | carried.keys(), rescan, carried, read
