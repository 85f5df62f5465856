"""Main cycles the store refused: kept, and run again once it takes writes.

A Main's message cycle that meets a store refusal (the map is full, a
commit failed, the file is damaged: a ``StoreError`` raised from one of the
cycle's writes, or the write of its start refused) consumes nothing: its
message stays in the Main's stored inbox (a child's result stays owed),
its working context is put back as the cycle found it, and the Main starts
no cycle until it is retried (its later messages wait behind it, in order).

The operator is told once per episode: one ERROR line saying what happened
and what to do, one INFO line when a retry runs through; the episode ends
at a periodic check that finds nothing held. Retries: one held Main runs
its cycle again alone (the Main held longest; a refused one goes to the back
of the line), first after ``check_interval`` seconds, then after twice as
long each time the store refuses it again (at most ``RETRY_MAX``); once a
retry is not refused, every held Main runs again.
``node.recovery.release_replay()`` retries at once, and a restart replays the kept
messages like any others.
"""

from __future__ import annotations

import logging
import uuid

from sessiontree.actors.runtime import RetryCycle
from sessiontree.protocol import ErrorCode, ErrorInfo
from sessiontree.supervision._entry import TreeEntry, id_text
from sessiontree.supervision._tree import Tree

__all__ = ["RETRY_MAX", "StoreHeld"]

log = logging.getLogger("sessiontree.cortex")

RETRY_MAX = 300.0  # seconds between retries at most, while the store keeps refusing


def _advice(code: ErrorCode) -> str:
    if code is ErrorCode.STORE_FULL:
        return (
            "make room: grow the map (Store.grow on a live node, or stop the node and "
            "start it again with a larger --map-size)"
        )
    if code is ErrorCode.STORE_DAMAGED:
        return "the store's file is damaged: stop the node and restore it from a backup"
    if code is ErrorCode.STORE_FENCED:
        return (
            "another process opened this store since this node did and holds it now: "
            "this node writes nothing more; stop it"
        )
    return "see the store's error above"


class StoreHeld:
    """The Mains whose cycle the store refused, and their retries (Cortex thread)."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.held: dict[uuid.UUID, TreeEntry] = {}  # oldest first
        self.probing: set[uuid.UUID] = set()  # Mains retried alone, until their cycle ends
        self.delay = 0.0
        self.due: float | None = None  # on the node's monotonic clock
        self.told = False

    def __len__(self) -> int:
        return len(self.held) + len(self.probing)

    def refused(self, entry: TreeEntry, error: ErrorInfo | None) -> None:
        """The store refused a cycle of ``entry`` (its input was kept): hold it,
        tell the operator if this begins an episode, and time the next retry."""
        rt = self.tree.rt
        sid = entry.session_id
        rt.counters["main_cycles_refused"] += 1
        self.held[sid] = entry
        interval = rt.config.check_interval
        if sid in self.probing:  # the retry was refused too: wait longer
            self.probing.discard(sid)
            self.delay = min(max(self.delay * 2, interval), RETRY_MAX)
            self.due = rt.clock.monotonic() + self.delay
        elif self.due is None:  # the first refusal since the last retry
            self.delay = self.delay or interval
            self.due = rt.clock.monotonic() + self.delay
        if self.told:
            return
        self.told = True
        code = error.code if error is not None else ErrorCode.STORE_FAILED
        log.error(
            "the store refused a write of Main %s's message cycle (%s: %s); the message "
            "stays in its inbox (a child's result stays owed) and runs again once the store "
            "takes writes, as does every cycle the store refuses until then (retried after "
            "%g s, then less often; at once with `sessiontree recovery release`); %s",
            id_text(entry),
            code.value,
            error.message if error is not None else "no detail",
            self.delay,
            _advice(code),
        )

    def ran(self, entry: TreeEntry) -> None:
        """A cycle of ``entry`` ended without a store refusal: if it was the
        retry, the store takes writes again and every held Main runs again."""
        if self.probing and entry.session_id in self.probing:
            self.probing.clear()  # those still running end as they will
            released = self.release()
            log.info(
                "the store takes writes again: %d more held Main cycle%s run again",
                released,
                "" if released == 1 else "s",
            )

    def tick(self) -> None:
        """The periodic check: retry the Main held longest, once it is time (a
        retry still running then does not hold the others back); the episode
        is over at a check that finds nothing held or in retry."""
        for sid in list(self.probing):
            entry = self.tree.entries.get(sid)
            if entry is None or entry.state.is_terminal:
                self.probing.discard(sid)  # it ended meanwhile
        if not self.held:
            if self.told and not self.probing:
                self._episode_over()
            return
        rt = self.tree.rt
        if self.due is None or self.tree.closing or rt.clock.monotonic() < self.due:
            return
        self.due = rt.clock.monotonic() + max(self.delay, rt.config.check_interval)
        while self.held:
            sid = next(iter(self.held))
            entry = self.held.pop(sid)
            if self._retry(entry):
                self.probing.add(sid)
                return

    def release(self) -> int:
        """Retry every held Main at once; how many were retried."""
        held, self.held = self.held, {}
        self.due = None  # a refusal of one of them times the next retry
        return sum(1 for entry in held.values() if self._retry(entry))

    def _retry(self, entry: TreeEntry) -> bool:
        if entry.state.is_terminal or self.tree.entries.get(entry.session_id) is not entry:
            return False
        self.tree.post(entry, RetryCycle())
        self.tree.rt.counters["main_cycles_retried"] += 1
        return True

    def _episode_over(self) -> None:
        """Nothing is held: the next refusal is told, and retried soon, again."""
        self.due = None
        self.delay = 0.0
        self.told = False
