"""``node.slots``: moving one slot's trees to another node.

The move, step by step (README, "Moving a slot"):

1. ``freeze(slot, deadline)`` on the source: new input into the slot (a
   send, a spawn from outside, a new Main of a key of the slot) is refused
   with ``SlotFrozenError``; running Branches park as at a shutdown (their
   records say they resume where the store is opened next); Workers finish;
   a Main's running cycle ends. Once all of it is at rest (``_slot_keeper``)
   and written, the slot is frozen. Past ``deadline`` (seconds on the node's
   clock) the freeze is abandoned instead: nothing is killed, the Branches
   it parked resume, input is taken again, and the outcome says what was
   still busy.
2. ``export(slot)``: the frozen slot's records (``store.slots.export``).
3. The new owner takes them in: ``import_(data)`` on its running node, or
   ``store.slots.import_`` on its store before a node opens it. Either way
   recovery brings the trees back as after a restart (Mains dormant, parked
   Branches resumed, TTLs re-armed from their absolute deadlines, results
   owed delivered once): over the slot's records alone on a running node.
4. ``release(slot, new_owner)`` on the source: the index forgets the slot's
   trees and the store deletes their records and keeps a tombstone; from
   then on the slot's sessions and keys answer ``SlotMovedError`` naming
   the owner.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from dataclasses import dataclass, field

from sessiontree.actors import AskTimeoutError
from sessiontree.protocol import NodeClosedError, RejectedInputError, SessionTreeError
from sessiontree.store import MovedRecord, SlotHeader, Store, check_slot, read_slot_export
from sessiontree.supervision._events import Event, EventBus
from sessiontree.supervision._faces import offloaded
from sessiontree.supervision._node_core import NodeCore
from sessiontree.supervision._slot_import import recover_slot
from sessiontree.supervision._slot_keeper import AdoptSlot, ForgetSlot, SlotQuiet, Unfreeze

__all__ = ["Freeze", "Slots"]

_LOOK_EVERY = 0.05  # real seconds between looks at a freezing slot when nothing happens


@dataclass(frozen=True, slots=True)
class Freeze:
    """What ``freeze`` did: ``frozen`` True once the slot is at rest; False when
    the deadline came first, with ``busy`` (session id -> why) what was not
    at rest then (the freeze was abandoned: the slot takes input again).
    ``parked``: the Branches the freeze parked."""

    slot: int
    frozen: bool
    busy: dict[str, str] = field(default_factory=dict)
    parked: tuple[uuid.UUID, ...] = ()


class Slots:
    """``node.slots``: freeze, export, release and import one slot (see the
    module's docstring). Each blocks the calling thread; its ``a``-twin runs it on a
    worker thread. Needs a node with a store (``NodeClosedError`` without)."""

    __slots__ = ("_events", "_node", "_parked")

    def __init__(self, node: NodeCore, events: EventBus) -> None:
        self._node = node
        self._events = events
        self._parked: dict[int, tuple[uuid.UUID, ...]] = {}  # per frozen slot

    @property
    def frozen(self) -> list[int]:
        """The slots frozen or freezing now, sorted."""
        return sorted(self._node.frozen_slots)

    def _store(self) -> Store:
        node = self._node
        node._check_open()
        if node.store is None:
            msg = "moving a slot needs a node with a store"
            raise NodeClosedError(msg)
        return node.store

    def freeze(self, slot: int, deadline: float = 30.0) -> Freeze:
        """Freeze ``slot`` (step 1 of the module's docstring), waiting up to
        ``deadline`` seconds on the node's clock. Returns a ``Freeze``: frozen,
        or abandoned with what was still busy (nothing killed). Raises
        ``RejectedInputError`` naming ``slot`` or ``deadline``,
        ``SlotMovedError`` for a slot this node released, ``NodeClosedError``
        without a store."""
        node = self._node
        store = self._store()
        check_slot(slot)
        if (
            isinstance(deadline, bool)
            or not isinstance(deadline, int | float)
            or not 0 <= deadline < float("inf")
        ):
            msg = f"deadline must be a finite number of seconds >= 0, not {deadline!r}"
            raise RejectedInputError(msg, field="deadline")
        store.slots.check_here(slot)
        clock = node.clock
        until = clock.monotonic() + deadline
        node.frozen_slots.add(slot)
        moved = threading.Event()

        def wake(_: Event) -> None:
            moved.set()

        unsubscribe = self._events.subscribe(wake)
        parked = list(self._parked.pop(slot, ()))  # frozen already: what that freeze parked
        try:
            while True:
                moved.clear()
                store.hurry()  # what the slot's sessions queued lazily is waited on now
                busy, asked = node._call(SlotQuiet(slot))
                parked.extend(asked)
                if not busy:
                    store.flush(node.config.ask_timeout)  # what they wrote lazily: durable
                    self._parked[slot] = tuple(parked)
                    return Freeze(slot, True, parked=tuple(parked))
                if clock.monotonic() >= until:
                    self._abandon(slot, tuple(parked))
                    return Freeze(slot, False, busy, tuple(parked))
                moved.wait(_LOOK_EVERY)
        except BaseException:
            with contextlib.suppress(SessionTreeError, AskTimeoutError):  # the first error stands
                self._abandon(slot, tuple(parked))
            raise
        finally:
            unsubscribe()

    def unfreeze(self, slot: int) -> None:
        """Take input into a frozen slot again and resume the Branches its freeze
        parked (a move given up). Nothing for a slot that is not frozen."""
        check_slot(slot)
        if slot in self._node.frozen_slots:
            self._abandon(slot, self._parked.get(slot, ()))

    def _abandon(self, slot: int, parked: tuple[uuid.UUID, ...]) -> None:
        node = self._node
        self._parked.pop(slot, None)
        try:
            if parked:
                node._call(Unfreeze(parked), check=False)
        finally:
            node.frozen_slots.discard(slot)

    def export(self, slot: int) -> bytes:
        """The frozen ``slot``'s records, for the new owner's ``store.slots.import_``
        (step 2). Raises ``RejectedInputError`` naming ``slot`` unless it is
        frozen, and what ``store.slots.export`` raises."""
        store = self._store()
        self._check_frozen(slot)
        return store.slots.export(slot)

    def release(self, slot: int, new_owner: str) -> MovedRecord:
        """Forget the frozen ``slot``'s trees and release its records to
        ``new_owner`` (step 4: call it once the new owner imported ``export``'s
        bytes); returns the tombstone. Raises ``RejectedInputError`` naming
        ``slot`` unless it is frozen and still at rest, or ``new_owner``;
        the store's error when its commit fails (the index has forgotten the
        trees then, the store still holds them: a restart brings them back)."""
        node = self._node
        store = self._store()
        self._check_frozen(slot)
        if not isinstance(new_owner, str) or not 0 < len(new_owner) <= 256:
            msg = f"new_owner must be a node's id (1 to 256 characters), not {new_owner!r}"
            raise RejectedInputError(msg, field="new_owner")
        busy, _ = node._call(SlotQuiet(slot, park=False))
        if busy:
            msg = f"slot {slot} is no longer at rest ({len(busy)} busy); freeze it again"
            raise RejectedInputError(msg, field="slot")
        node._call(ForgetSlot(slot))
        try:
            return store.slots.release(slot, new_owner)
        finally:
            self._parked.pop(slot, None)
            node.frozen_slots.discard(slot)

    def import_(self, data: bytes) -> SlotHeader:
        """Take in a slot another node exported (step 3 on a running node): the
        store imports it (``store.slots.import_``: one transaction onto absent
        keys), then recovery runs over its records alone and the Cortex brings
        its trees in as a start would (Mains dormant, parked Branches running
        again, TTLs re-armed from their absolute deadlines, results owed
        delivered once). Returns the export's header. Raises what
        ``store.slots.import_`` raises (nothing imported), ``StoreError`` when
        recovery's writes fail (the records are in the store: a restart
        brings them back), ``NodeClosedError`` without a store."""
        node = self._node
        store = self._store()
        export = read_slot_export(data)
        header = store.slots.import_(data)
        plan = recover_slot(store, export, node._runtime.agents, node.clock.time(), node.config)
        node._call(AdoptSlot(plan))
        return header

    def _check_frozen(self, slot: int) -> None:
        check_slot(slot)
        if slot not in self._node.frozen_slots or slot not in self._parked:
            msg = f"slot {slot} is not frozen (node.slots.freeze first)"
            raise RejectedInputError(msg, field="slot")

    afreeze = offloaded(freeze)
    aexport = offloaded(export)
    arelease = offloaded(release)
    aimport_ = offloaded(import_)
