"""The Cortex's side of moving a slot (``node.slots``): parking what runs in
it, saying what still runs, and forgetting its trees once released.

An ``Extension`` answering its own requests, so the kernel knows nothing of
slots: ``SlotQuiet`` parks the slot's active Branches as a shutdown does
(their records say they resume wherever the store is opened next) and
answers what of the slot is not yet at rest; ``Unfreeze`` resumes the
Branches a freeze parked; ``ForgetSlot`` drops the slot's sessions from the
index once the store no longer holds them here; ``AdoptSlot`` brings an
imported slot's trees in, as a start brings a store's back
(``Starting.bring_back`` with recovery's plan for the slot alone). All run
on the Cortex thread.

At rest, a slot's session is: ended (its skill returned, its ending
written); a Branch suspended; a Main dormant, or
idle (no cycle running, nothing owed to it or in flight, its last snapshot
durable). A Worker, a Branch still running, a session being cancelled or
created, or a Main in a cycle is not.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from sessiontree.protocol import ErrorCode, NodeClosedError, SessionKind, SessionState, slot_of
from sessiontree.supervision._entry import TreeEntry, unsettled
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._extension import Extension
from sessiontree.supervision._recovery import Recovered
from sessiontree.supervision._requests import Request

__all__ = ["AdoptSlot", "ForgetSlot", "SlotKeeper", "SlotQuiet", "Unfreeze"]


class SlotQuiet(Request[tuple[dict[str, str], list[uuid.UUID]]], frozen=True):
    """What of ``slot`` is not at rest (session id -> why), and the Branches this
    call asked to park (``park``: the active ones are asked, as a shutdown does)."""

    slot: int
    park: bool = True


class Unfreeze(Request[int], frozen=True):
    """Resume the Branches a freeze parked (``branches``); how many were."""

    branches: tuple[uuid.UUID, ...]


class ForgetSlot(Request[int], frozen=True):
    """Drop every session of ``slot`` from the index (the store released them);
    how many. What still runs in it is let go: nothing it does counts."""

    slot: int


class AdoptSlot(Request[None], frozen=True):
    """Bring in the trees of an imported slot: recovery's ``plan`` for it."""

    plan: Recovered


class SlotKeeper(Extension):
    """Answers ``SlotQuiet``, ``Unfreeze``, ``ForgetSlot`` and ``AdoptSlot`` (the
    Cortex's thread)."""

    answers: ClassVar[tuple[type, ...]] = (SlotQuiet, Unfreeze, ForgetSlot, AdoptSlot)

    def bind(self, cortex: Any) -> None:
        self.tree = cortex.tree
        self.suspension = cortex.suspension
        self.starting = cortex.starting

    def answer(self, request: Any, reply: Any) -> object:
        if isinstance(request, SlotQuiet):
            return self._quiet(request.slot, park=request.park)
        if isinstance(request, Unfreeze):
            return self._unfreeze(request.branches)
        if isinstance(request, AdoptSlot):
            self._adopt(request.plan)
            return None
        return self._forget(request.slot)

    def _adopt(self, plan: Recovered) -> None:
        tree = self.tree
        if tree.closing:
            msg = "node is shutting down"
            raise NodeClosedError(msg)
        tree.dormant.update(plan.dormant)  # bring_back takes the plan's as the node's
        plan.dormant = tree.dormant
        self.suspension.adopt(self.starting.bring_back(plan))

    def _of(self, slot: int) -> list[TreeEntry]:
        return [e for sid, e in self.tree.entries.items() if slot_of(sid) == slot]

    def _quiet(self, slot: int, *, park: bool) -> tuple[dict[str, str], list[uuid.UUID]]:
        busy: dict[str, str] = {}
        parked: list[uuid.UUID] = []
        for entry in self._of(slot):
            if park and _parkable(entry):
                entry.shutdown_park = True  # its record: resume where it comes back
                self.suspension.request_suspend(entry)
                self.tree.emit(EventKind.SUSPEND_REQUESTED, entry, data={"why": "freeze"})
                parked.append(entry.session_id)
            why = _busy(entry)
            if why is not None:
                busy[str(entry.session_id)] = why
        return busy, parked

    def _unfreeze(self, branches: tuple[uuid.UUID, ...]) -> int:
        resumed = 0
        for session_id in branches:
            entry = self.tree.entries.get(session_id)
            if entry is None or entry.state.is_terminal:
                continue
            entry.shutdown_park = False
            if self.suspension.resume(session_id) is None:
                resumed += 1
        return resumed

    def _forget(self, slot: int) -> int:
        tree = self.tree
        forgotten = 0
        for entry in self._of(slot):
            if entry.ttl_timer is not None:
                entry.ttl_timer.cancel()
                entry.ttl_timer = None
            if entry.grant is not None:
                tree.rt.slots.forget(entry.grant)
                entry.grant = None
            core = entry.core
            core.fence(ErrorCode.SLOT_MOVED)  # a skill still parked lets go; nothing counts
            core.release(ErrorCode.SLOT_MOVED)
            core.slots.release()
            del tree.entries[entry.session_id]
            if entry.zombie:  # its run's end finds no entry: counted out here
                entry.zombie = False
                if entry.kind is SessionKind.MAIN:
                    tree.main_zombies -= 1
                else:
                    tree.zombies -= 1
            if not entry.state.is_terminal:
                tree.live -= 1
                if entry.needs_thread:
                    tree.sync_threads -= 1
            tree.resident_mains.pop(entry.session_id, None)
            tree.stop_actor(entry)
            forgotten += 1
        for session_id in [sid for sid in tree.dormant if slot_of(sid) == slot]:
            del tree.dormant[session_id]
            tree.next_seqs.pop(session_id, None)
            tree.ledgers_at_rest.pop(session_id, None)
            forgotten += 1
        for key, session_id in list(tree.mains.items()):
            if slot_of(session_id) == slot:
                del tree.mains[key]
        return forgotten


def _parkable(entry: TreeEntry) -> bool:
    """An active inline Branch nobody asked to stop or park yet (as a shutdown parks)."""
    return (
        entry.kind is SessionKind.BRANCH
        and entry.state is SessionState.ACTIVE
        and entry.cancel_code is None
        and not entry.suspend_requested
        and entry.core.remote is None
    )


def _busy(entry: TreeEntry) -> str | None:
    """Why ``entry`` is not at rest (see the module's docstring), or None."""
    state = entry.state
    if state.is_terminal:
        if entry.zombie:
            return "ended, its skill still running"
        written = entry.final_write
        return "its ending is being written" if written is not None and not written.done() else None
    if entry.cancel_code is not None:
        return "being cancelled"
    if entry.kind is SessionKind.WORKER:
        return "a worker still running"
    if entry.kind is SessionKind.BRANCH:
        return None if state is SessionState.SUSPENDED else "a branch not parked yet"
    core = entry.core
    written = entry.snapshot_write
    if (
        state is not SessionState.ACTIVE
        or core.skill_running
        or core.fenced
        or entry.inflight
        or not entry.persisted
        or entry.waiters
        or entry.receipts
        or entry.unconsumed
        or unsettled(entry)
        or (written is not None and not written.done())
    ):
        return "a Main in a cycle, or with input not yet written"
    return None
