"""Memory pressure: the probe a node reads on each periodic check, and what a
reading calls for.

The probe is ``NodeConfig.memory_pressure`` when the embedder gives one (it
returns the fraction of memory in use, or a bool: True reads as 1.0 — past
any high mark — and False as 0.0 — below any low mark), else the built-in
``MemoryProbe`` unless ``NodeConfig.memory_probe`` is False. A reading at or
above ``memory_high`` suspends a branch; one below ``memory_low`` resumes
branches that pressure suspended; between the two nothing changes
(hysteresis, so branches do not flap).
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable

from sessiontree.supervision._config import NodeConfig
from sessiontree.supervision._memory_probe import MemoryProbe

__all__ = ["MemoryWatch", "Step", "step"]

log = logging.getLogger("sessiontree.cortex")


class Step(enum.Enum):
    """What one reading calls for."""

    SUSPEND = "suspend"
    RESUME = "resume"
    HOLD = "hold"


def step(fraction: float | None, high: float, low: float) -> Step:
    """``SUSPEND`` at or past ``high``, ``RESUME`` below ``low``, else (between
    the marks, or no reading) ``HOLD``."""
    if fraction is None:
        return Step.HOLD
    if fraction >= high:
        return Step.SUSPEND
    if fraction < low:
        return Step.RESUME
    return Step.HOLD


class MemoryWatch:
    """Calls the node's memory probe and checks what it returns (on the clock's
    timer thread, when the periodic check's timer fires; one call at a time).

    A probe that raises, or returns anything but a bool, None or a finite
    number >= 0, is logged once (until it reads well again) and read as no
    reading: nothing is suspended or resumed for it.
    """

    def __init__(self, config: NodeConfig) -> None:
        probe: Callable[[], object] | None = config.memory_pressure
        if probe is None and config.memory_probe:
            probe = MemoryProbe()
        self.probe = probe
        self.high = config.memory_high
        self.low = config.memory_low
        self.last: float | None = None  # the last good reading
        self._failing = False

    def read(self) -> float | None:
        """The fraction of memory in use, or None (no probe, or no reading)."""
        if self.probe is None:
            return None
        try:
            raw = self.probe()
        except Exception:
            if not self._failing:
                log.exception("memory-pressure probe raised; read as no reading")
            self._failing = True
            return None
        fraction = _fraction(raw)
        if fraction is None and raw is not None:
            if not self._failing:
                log.warning(
                    "memory-pressure probe returned %r, not a fraction >= 0 or a bool; "
                    "read as no reading",
                    raw,
                )
            self._failing = True
            return None
        self._failing = False
        self.last = fraction
        return fraction


def _fraction(raw: object) -> float | None:
    if isinstance(raw, bool):
        return 1.0 if raw else 0.0
    if isinstance(raw, int | float) and math.isfinite(raw) and raw >= 0:
        return float(raw)
    return None
