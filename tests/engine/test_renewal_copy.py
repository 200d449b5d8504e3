"""Renewal copies the loop's live dict of held claims while the loop mutates it (engine/renewal.py).
The copy must not run Python code mid-iteration: in CPython 3.11 ``list(d.items())`` allocates a
tuple per entry, an allocation can start a garbage collection, and a finalizer it runs is Python
code, at which the interpreter may switch to the loop thread, which adds or pops a claim: the copy
then raises "dictionary changed size during iteration" outside the renewal's DatabaseError handler,
and the renewal thread ends (no renewal, no heartbeat: every claim of the engine lapses). Here the
finalizer itself mutates the dict, standing in for the loop thread."""

from __future__ import annotations

import gc
import types

from weft_django.engine.renewal import Renewal
from weft_django.engine.wake import Wake


class _Garbage:
    """Cyclic garbage with a finalizer that changes the held dict (as the loop thread would)."""

    held: dict[str, types.SimpleNamespace] = {}

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        _Garbage.held[f"new-{id(self)}"] = types.SimpleNamespace(epoch=2)


def test_the_copy_of_the_live_claims_survives_a_mutation_during_a_collection() -> None:
    held = {f"w{i}": types.SimpleNamespace(epoch=1) for i in range(20_000)}
    _Garbage.held = held
    renewal = Renewal.__new__(Renewal)
    renewal.wake = Wake("copy")
    renewal.publish(held, {})  # type: ignore[arg-type]
    thresholds = gc.get_threshold()
    try:
        for threshold in range(100, 20_000, 250):  # a collection at some point of the copy
            gc.collect()
            _Garbage()  # unreachable at once: collected by the next generation-0 collection
            gc.set_threshold(threshold)
            try:
                epochs = renewal.epochs()
            finally:
                gc.set_threshold(*thresholds)
            assert {f"w{i}" for i in range(20_000)} <= set(epochs)
    finally:
        gc.set_threshold(*thresholds)
