"""The store's housekeeping: a canonical export and retention, on a schedule.

Both are off unless configured (``NodeConfig.export_path``,
``NodeConfig.prune_after``); when configured, they run every
``housekeeping_interval`` seconds on the node's clock, on a thread of their
own (never the Cortex's), and on demand through ``Node.housekeep()``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sessiontree.actors import Clock, TimerHandle
from sessiontree.protocol import SessionTreeError
from sessiontree.store import Store, export_jsonl, prune
from sessiontree.supervision._config import NodeConfig

__all__ = ["Housekeeper"]

log = logging.getLogger("sessiontree.housekeeping")


class Housekeeper:
    """Exports the store to ``config.export_path`` and prunes terminal sessions
    older than ``config.prune_after`` (exported first when both are set)."""

    def __init__(self, store: Store, config: NodeConfig, clock: Clock) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.runs = 0
        self.failures = 0
        self._timer: TimerHandle | None = None
        self._lock = threading.Lock()  # one run at a time
        self._closed = False

    @property
    def configured(self) -> bool:
        return self.config.export_path is not None or self.config.prune_after is not None

    def start(self) -> None:
        """Arm the schedule (nothing happens when neither job is configured)."""
        if self.configured:
            self._timer = self.clock.call_later(self.config.housekeeping_interval, self._due)

    def stop(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:  # a run in progress finishes before the store closes
            pass

    def _due(self) -> None:
        # On the clock's timer thread: hand the work to a thread of its own.
        if self._closed:
            return
        threading.Thread(
            target=self._scheduled, name="sessiontree-housekeeping", daemon=True
        ).start()

    def _scheduled(self) -> None:
        try:
            self.run()
        except (SessionTreeError, OSError) as exc:  # logged and counted; tried again next time
            self.failures += 1
            log.error("housekeeping failed: %s", exc)
        finally:
            if not self._closed:
                self._timer = self.clock.call_later(self.config.housekeeping_interval, self._due)

    def run(self) -> dict[str, Any]:
        """Export, then prune, now. Raises ``OSError`` when the export cannot be
        written (nothing is pruned then) and ``StoreError`` when the store refuses."""
        with self._lock:
            done: dict[str, Any] = {}
            path, age = self.config.export_path, self.config.prune_after
            if age is not None:
                done["pruned"] = prune(self.store, age, self.clock.time(), export_to=path)
                if path is not None:
                    done["exported_to"] = path
            elif path is not None:
                done["exported"] = export_jsonl(self.store, path)
                done["exported_to"] = path
            self.runs += 1
            return done
