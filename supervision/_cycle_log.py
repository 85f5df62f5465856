"""The log of failed Main message cycles, bounded so a crash loop cannot flood it.

A Main's skill that raises does not end its Main: the cycle is counted
(``main_cycles_failed``) and the next message runs the skill again. Each
failed cycle is logged at ERROR on ``sessiontree.cortex`` with the
skill's traceback (carried in the error's ``detail``), at most ``burst``
in any ``window`` seconds of the node's clock for the whole node. A Main
that crashes on every child result of a wide fan-out fails once per
child, so past the burst the failures are only counted, and the first one
logged after the window closes says how many were left out.
"""

from __future__ import annotations

import logging

from sessiontree.protocol import ErrorInfo, SessionInfo

__all__ = ["FailedCycles"]

log = logging.getLogger("sessiontree.cortex")


class FailedCycles:
    """Logs failed Main cycles, ``burst`` in a ``window`` at most (Cortex thread only)."""

    def __init__(self, burst: int = 10, window: float = 60.0) -> None:
        self.burst = burst
        self.window = window
        self._opened: float | None = None  # when the current window began
        self._logged = 0  # logged in the current window
        self._left_out = 0  # failed past the burst in the current window

    def failed(
        self, session: str, info: SessionInfo, cycle: int, error: ErrorInfo, now: float
    ) -> bool:
        """Log one failed cycle of the Main ``info`` (``session``: its id as text),
        unless this window's burst is spent; True if it was logged. The
        traceback is read from ``error.detail`` when there."""
        if self._opened is None or now - self._opened >= self.window:
            if self._left_out:
                log.warning(
                    "%d more failed Main cycles were not logged in %.0f s "
                    "(sessiontree_main_cycles_failed counts every one)",
                    self._left_out,
                    self.window,
                )
            self._opened, self._logged, self._left_out = now, 0, 0
        if self._logged >= self.burst:
            self._left_out += 1
            return False
        self._logged += 1
        trace = error.detail.get("traceback") if isinstance(error.detail, dict) else None
        last = self._logged == self.burst
        log.error(
            "Main %s of agent %r: message cycle %d (skill %r) failed with %s: %s%s%s",
            session,
            info.agent_id,
            cycle,
            info.skill,
            error.code.value,
            error.message,
            f"\n{trace.rstrip()}" if isinstance(trace, str) and trace else "",
            f"\n(the next failed cycles in {self.window:.0f} s are only counted)" if last else "",
        )
        return True
