"""The collector settings of a node that holds many sessions (``NodeConfig.gc_tuning``).

CPython's cyclic collector runs a young collection every 700 net new
container objects and, as the heap grows, full collections that walk every
object alive. A node holding tens of thousands of sessions (some sixty small
objects each) then spends about half of its CPU walking sessions that are not
garbage (measured: 46 s of a 102 s benchmark run). Tuned, young collections
run every 50,000 and the middle generation every 20 of those, so full
collections become rare. Reference counting still frees every acyclic object
at once; only cyclic garbage waits longer.

The thresholds are process-wide: the first tuned node sets them and the last
one to close puts back what it found.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["TUNED_THRESHOLDS", "release_gc", "tune_gc"]

TUNED_THRESHOLDS = (50_000, 20, 20)

_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] = gc.get_threshold()


def tune_gc() -> None:
    """Set the tuned thresholds (one more holder); never fails."""
    global _holders, _saved  # noqa: PLW0603 - the process-wide setting and who holds it
    with _lock:
        if _holders == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(*TUNED_THRESHOLDS)
        _holders += 1


def release_gc() -> None:
    """One holder fewer; the last puts back the thresholds it found. Never fails."""
    global _holders  # noqa: PLW0603 - see tune_gc
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            gc.set_threshold(*_saved)
