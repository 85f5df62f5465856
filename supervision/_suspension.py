"""Suspension: a Branch parks at its next checkpoint and gives up its compute
slot and its actor; a resume lets it go on (a restored one runs again).

Memory pressure suspends branches too; those it suspended (and only those)
are marked, so that it resumes them once memory is free again. A caller's
suspend or resume of a marked branch takes the mark off: from then on it is
the caller's to resume.

Refusals are answers (``ErrorInfo`` with ``invalid_transition`` or
``node_closed``); an unknown session raises ``UnknownSessionError``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from sessiontree.protocol import ErrorCode, ErrorInfo, SessionKind, SessionState
from sessiontree.supervision._entry import TreeEntry
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._starting import Starting
from sessiontree.supervision._tree import Tree

__all__ = ["Suspension"]

log = logging.getLogger("sessiontree.cortex")


class Suspension:
    """Suspends and resumes Branches (Cortex thread)."""

    def __init__(self, tree: Tree, starting: Starting) -> None:
        self.tree = tree
        self.starting = starting
        # branches memory pressure suspended -> the monotonic time it did
        self.pressured: dict[uuid.UUID, float] = {}

    def suspend(self, session_id: uuid.UUID) -> ErrorInfo | None:
        """Ask a Branch to park at its next checkpoint (a caller's suspend: a
        branch memory pressure suspended stays suspended, now for the caller)."""
        entry = self.tree.entry(session_id)
        if entry is None:
            return self.tree.ended_answer(session_id)
        if self._unmark(entry) and self._pressure_held(entry):
            return None
        if entry.kind is not SessionKind.BRANCH:
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} is a {entry.kind.value}; only branches suspend",
            )
        if entry.state is not SessionState.ACTIVE or entry.cancel_code is not None:
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} is {entry.state.value}; only active branches "
                "suspend",
            )
        if entry.core.remote is not None:
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} runs on the {entry.info.backend} backend; "
                "only inline branches suspend",
            )
        if not entry.suspend_requested:
            self.request_suspend(entry)
            self.tree.emit(EventKind.SUSPEND_REQUESTED, entry)
        return None

    def request_suspend(self, entry: TreeEntry) -> None:
        entry.suspend_requested = True
        core = entry.core
        with core.cond:
            core.suspend_requested = True
            still_parked = core.parked  # resumed a moment ago, not yet off its checkpoint
            core.wake()
        if still_parked:  # it stays parked and will not report again: suspended now
            self.tree.set_state(entry, SessionState.SUSPENDED)
            self.tree.stop_actor(entry)

    def parked(self, session_id: uuid.UUID) -> None:
        """A Branch's skill parked at a checkpoint: it is suspended now."""
        tree = self.tree
        entry = tree.entries.get(session_id)
        if entry is None or not entry.suspend_requested or entry.state is not SessionState.ACTIVE:
            return
        with entry.core.cond:
            parked = entry.core.parked  # False when a resume already let it go (stale)
        if entry.cancel_code is not None or not parked:
            return
        tree.set_state(entry, SessionState.SUSPENDED)
        tree.stop_actor(entry)  # its parked skill needs no mailbox; nothing is queued for it
        if tree.shutdown_waiters:
            tree.check_shutdown()

    def resume(self, session_id: uuid.UUID) -> ErrorInfo | None:
        """Resume a suspended Branch (or withdraw a suspension not yet taken)."""
        entry = self.tree.entry(session_id)
        if entry is None:
            return self.tree.ended_answer(session_id)
        self._unmark(entry)
        return self._resume(entry)

    def _resume(self, entry: TreeEntry) -> ErrorInfo | None:
        tree = self.tree
        session_id = entry.session_id
        if (
            entry.kind is not SessionKind.BRANCH
            or not entry.suspend_requested
            or entry.state.is_terminal
            or entry.cancel_code is not None
        ):
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} ({entry.kind.value}, {entry.state.value}) is not "
                "suspended",
            )
        if tree.closing:
            return ErrorInfo(code=ErrorCode.NODE_CLOSED, message="node is shutting down")
        if entry.rerun:
            self.starting.rerun(entry)
            return None
        entry.suspend_requested = False
        if entry.state is SessionState.SUSPENDED:
            tree.set_state(entry, SessionState.ACTIVE)
        # counts as activity: otherwise its checkpoint from before it parked
        # would make it the first branch the next memory pressure suspends
        entry.core.touch()
        entry.core.request_suspend(False)
        return None

    # -- memory pressure ----------------------------------------------------------------

    def suspend_for_pressure(self, data: dict[str, Any]) -> TreeEntry | None:
        """Ask the running inline branch whose last checkpoint (or resume) is
        oldest to suspend, and mark it as suspended by memory pressure; None
        when no branch can suspend. ``data`` goes into its events."""
        candidates = [
            entry
            for entry in self.tree.entries.values()
            if entry.kind is SessionKind.BRANCH
            and entry.state is SessionState.ACTIVE
            and not entry.suspend_requested
            and entry.cancel_code is None
            and entry.core.remote is None
        ]
        if not candidates:
            return None
        victim = min(candidates, key=lambda e: e.core.last_checkpoint)
        tree = self.tree
        self.pressured[victim.session_id] = tree.rt.clock.monotonic()
        victim.pressured = True
        tree.rt.counters["pressure_suspensions"] += 1
        tree.emit(EventKind.MEMORY_PRESSURE, victim, data=data)
        log.warning(
            "memory pressure (%s): asking branch %s to suspend", _figures(data), victim.session_id
        )
        self.request_suspend(victim)
        tree.emit(EventKind.SUSPEND_REQUESTED, victim, data={"reason": "memory_pressure"})
        return victim

    def resume_after_pressure(self, most: int, data: dict[str, Any]) -> list[TreeEntry]:
        """Resume up to ``most`` branches memory pressure suspended, the
        oldest-created first (ties: the first suspended); marks of branches
        that ended or were cancelled meanwhile are dropped."""
        tree = self.tree
        waiting = []
        for session_id, since in list(self.pressured.items()):
            entry = tree.entries.get(session_id)
            if entry is None or not self._pressure_held(entry):
                del self.pressured[session_id]
                if entry is not None:
                    entry.pressured = False
            else:
                waiting.append((entry.info.created_at, since, entry))
        waiting.sort(key=lambda item: item[:2])
        now = tree.rt.clock.monotonic()
        resumed = []
        for _, since, entry in waiting[:most]:
            session_id = entry.session_id
            self._unmark(entry)
            if self._resume(entry) is not None:  # a closing node: leave it be
                continue
            tree.rt.counters["pressure_resumptions"] += 1
            log.info("memory free again (%s): resumed branch %s", _figures(data), session_id)
            tree.emit(EventKind.MEMORY_RELIEVED, entry, data={**data, "suspended_s": now - since})
            resumed.append(entry)
        return resumed

    def adopt(self, entries: list[TreeEntry]) -> None:
        """Branches memory pressure had suspended before a restart: resumed like
        any it suspended, once memory is free again."""
        now = self.tree.rt.clock.monotonic()
        for entry in entries:
            self.pressured[entry.session_id] = now
            entry.pressured = True

    def _unmark(self, entry: TreeEntry) -> bool:
        """No longer suspended by memory pressure; whether it was."""
        entry.pressured = False
        return self.pressured.pop(entry.session_id, None) is not None

    def pressure_suspended(self) -> int:
        """How many branches memory pressure holds suspended (or asked to)."""
        entries = self.tree.entries
        return sum(
            1
            for session_id in self.pressured
            if (entry := entries.get(session_id)) is not None and self._pressure_held(entry)
        )

    @staticmethod
    def _pressure_held(entry: TreeEntry) -> bool:
        """Whether a marked branch is still suspended (or asked to) and live."""
        return entry.suspend_requested and not entry.state.is_terminal and entry.cancel_code is None


def _figures(data: dict[str, Any]) -> str:
    """``used 0.93, high 0.9`` from an event's data, for the log."""
    return ", ".join(f"{name} {value:.3g}" for name, value in data.items())
