"""The node's recent events for HTTP subscribers: a bounded ring, and a bounded
queue per subscriber fed in batches on the server's event loop.

The node calls ``EventHub`` on whatever thread emits (often the node's own
event loop, which also serves the Cortex), so that side only numbers the
event, appends it to the ring and, when someone listens, to a pending batch,
scheduling one hand-over to the server's loop per batch
(``call_soon_threadsafe``); it never blocks beyond a short lock and never
serialises. Everything else (filtering, queueing, encoding) happens on the
server's loop.

Memory stays bounded whatever the consumers do: the ring keeps the last
``ring_size`` events; a subscriber's queue holds at most ``queue_size``; a
subscriber whose queue would overflow is cut off (its queue dropped, a final
``overflow`` message owed to it) and removed; a pending batch that the
server's loop does not take in time (more than ``ring_size`` events) is
dropped and every subscriber cut off the same way.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sessiontree.supervision import Event, EventKind, Node

__all__ = ["FLUSH_DELAY", "EventFilter", "EventHub", "Subscriber", "wire_of"]

FLUSH_DELAY = 0.01  # seconds a batch gathers before it goes to the followers
_ENCODER = msgspec.json.Encoder(enc_hook=repr)  # a skill's progress data may hold anything


class _Item:
    """One event in the ring, numbered, with its wire form made once on first use."""

    __slots__ = ("_wire", "event", "seq")

    def __init__(self, seq: int, event: Event) -> None:
        self.seq = seq
        self.event = event
        self._wire: bytes | None = None

    def wire(self) -> bytes:
        """The event as one server-sent-event message (``id``, ``event``, ``data``)."""
        if self._wire is None:
            data = _ENCODER.encode(wire_of(self.seq, self.event))
            self._wire = b"id: %d\nevent: %s\ndata: %s\n\n" % (
                self.seq,
                self.event.kind.value.encode(),
                data,
            )
        return self._wire


def wire_of(seq: int, event: Event) -> dict[str, Any]:
    """The JSON object of one event on the stream."""
    return {
        "seq": seq,
        "type": event.kind.value,
        "session_id": event.session_id,
        "parent_id": event.parent_id,
        "agent": event.agent_id,
        "kind": event.session_kind,
        "at": event.at,
        "state": event.state,
        "previous": event.previous,
        "code": event.code,
        "data": event.data,
    }


@dataclass(frozen=True, slots=True)
class EventFilter:
    """What a subscriber wants: every field None takes everything. ``root``: that
    session and its descendants; ``agent``; ``kind`` (main, branch, worker);
    ``types``: ``EventKind`` values."""

    root: uuid.UUID | None = None
    agent: str | None = None
    kind: str | None = None
    types: frozenset[str] | None = None

    @property
    def everything(self) -> bool:
        return self.root is None and self.agent is None and self.kind is None and not self.types


@dataclass(slots=True, eq=False)  # compared and hashed by identity
class Subscriber:
    """One follower of the stream. Lives on the server's loop: ``offer`` and the
    reads of ``queue`` happen there only.

    ``subtree`` (with a ``root`` filter) grows as the events say children are
    spawned under it. ``last_seq`` is the last event offered (earlier ones are
    ignored, so replay and live batches never repeat one). ``cut`` is set once
    its queue overflowed (``reason`` "overflow") or the hub closed ("closed");
    ``dropped`` then says how many queued events were let go."""

    filter: EventFilter
    bound: int
    last_seq: int
    subtree: set[uuid.UUID] = field(default_factory=set)
    queue: deque[_Item] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    cut: bool = False
    reason: str = ""
    dropped: int = 0

    def wants(self, event: Event) -> bool:
        flt = self.filter
        if flt.root is not None:
            sid = event.session_id
            if (
                event.kind is EventKind.SPAWNED
                and sid is not None
                and event.parent_id in self.subtree
            ):
                self.subtree.add(sid)
            # a refused spawn (no session of its own) belongs where its parent does
            if (sid if sid is not None else event.parent_id) not in self.subtree:
                return False
        if flt.types and event.kind.value not in flt.types:
            return False
        if flt.agent is not None and event.agent_id != flt.agent:
            return False
        return flt.kind is None or event.session_kind == flt.kind

    def take(self, items: Sequence[_Item]) -> bool:
        """Queue what it wants of ``items``; False (and cut) once its queue is full."""
        if self.filter.everything and items and items[0].seq > self.last_seq:
            # the common case of a whole batch, taken without a loop in Python
            if len(self.queue) + len(items) > self.bound:
                self.cut_off(len(items))
                return False
            self.queue.extend(items)
            self.last_seq = items[-1].seq
            self.wake.set()
            return True
        for item in items:
            if item.seq <= self.last_seq:
                continue
            self.last_seq = item.seq
            if not self.wants(item.event):
                continue
            if len(self.queue) >= self.bound:
                self.cut_off(1)
                return False
            self.queue.append(item)
        if self.queue:
            self.wake.set()
        return True

    def cut_off(self, extra: int = 0, reason: str = "overflow") -> None:
        """Drop its queue (``extra`` more events counted as dropped) and owe it a
        final message saying ``reason`` (``overflow`` or ``closed``)."""
        self.dropped = len(self.queue) + extra
        self.queue.clear()
        self.cut = True
        self.reason = reason
        self.wake.set()


class EventHub:
    """The ring of the node's last ``ring_size`` events and their subscribers.

    Subscribes to ``node`` at once (so the ring holds events from then on);
    ``close`` unsubscribes and cuts every subscriber off. ``queue_size`` bounds
    each subscriber's queue."""

    def __init__(self, node: Node, *, ring_size: int = 4096, queue_size: int = 1024) -> None:
        if ring_size < 1 or queue_size < 1:
            msg = f"ring_size ({ring_size}) and queue_size ({queue_size}) must be >= 1"
            raise ValueError(msg)
        self.ring_size = ring_size
        self.queue_size = queue_size
        self._lock = threading.Lock()
        self._ring: deque[_Item] = deque(maxlen=ring_size)
        self._seq = 0
        self._pending: list[_Item] = []
        self._lost = 0  # events dropped from a pending batch the loop did not take
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscribers: set[Subscriber] = set()  # touched on the loop only
        self._listening = False
        self._cut_count = 0
        self._most_queued = 0
        self._cut = threading.Condition()
        self._unsubscribe = node.subscribe(self._on_event)

    # -- the emitting thread --------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        with self._lock:
            self._seq += 1
            item = _Item(self._seq, event)
            self._ring.append(item)
            if not self._listening:
                return
            if len(self._pending) >= self.ring_size:
                self._lost += 1  # the server's loop is not keeping up: no growth
                return
            self._pending.append(item)
            if self._scheduled or self._loop is None:
                return
            self._scheduled = True
            loop = self._loop
        try:
            loop.call_soon_threadsafe(self._arm, loop)
        except RuntimeError:  # the server's loop is closed: nobody left to tell
            with self._lock:
                self._pending.clear()

    # -- the server's loop ----------------------------------------------------------

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        # the batch gathers for FLUSH_DELAY: one wake-up of the server's loop (a
        # syscall on the emitting thread) and one write per follower per burst
        loop.call_later(FLUSH_DELAY, self._flush)

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            lost, self._lost = self._lost, 0
            self._scheduled = False
        for sub in list(self._subscribers):
            if lost:
                sub.cut_off(lost)
            elif sub.take(batch):
                self._most_queued = max(self._most_queued, len(sub.queue))
                continue
            self._drop(sub)

    def _drop(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)
        with self._lock:
            self._listening = bool(self._subscribers)
        with self._cut:
            self._cut_count += 1
            self._cut.notify_all()

    @property
    def last_seq(self) -> int:
        """The number of the latest event (0 before the first)."""
        with self._lock:
            return self._seq

    def held(self, after: int) -> tuple[list[_Item], int | None]:
        """The ring's events after ``after`` and how many were missed before them:
        0 when none, None when unknown (``after`` is newer than the latest
        event: a number from before a restart of the node)."""
        with self._lock:
            return self._held(after)

    def _held(self, after: int) -> tuple[list[_Item], int | None]:
        if after > self._seq:
            return list(self._ring), None
        oldest = self._ring[0].seq if self._ring else self._seq + 1
        missed = max(0, oldest - after - 1)
        return [item for item in self._ring if item.seq > after], missed

    def subscribe(
        self,
        flt: EventFilter,
        after: int,
        subtree: Iterable[uuid.UUID] = (),
        *,
        register: bool = True,
    ) -> tuple[Subscriber, list[_Item], int | None]:
        """A new subscriber (call on the server's loop), the ring's events after
        ``after`` that it wants, to send first (not counted against its queue's
        bound: the ring bounds them), and how many it missed (as ``held``).
        ``register=False``: only the ring's events, nothing live."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._loop = loop
            held, missed = self._held(after)
            sub = Subscriber(flt, self.queue_size, held[-1].seq if held else self._seq)
            self._listening = self._listening or register
        sub.subtree.update(subtree)
        # before any live batch reaches it, so the subtree learns the held spawns first
        wanted = [item for item in held if sub.wants(item.event)]
        if register:
            self._subscribers.add(sub)
        return sub, wanted, missed

    def unsubscribe(self, sub: Subscriber) -> None:
        """Forget ``sub`` (call on the server's loop; a second call does nothing)."""
        self._subscribers.discard(sub)
        with self._lock:
            self._listening = bool(self._subscribers)

    def stats(self) -> dict[str, int]:
        """``subscribers``, ``ring`` (events held), ``last_seq``, ``cut_off``
        (subscribers cut off so far), ``most_queued`` (the longest any
        subscriber's queue has been)."""
        with self._lock:
            ring, seq = len(self._ring), self._seq
        return {
            "subscribers": len(self._subscribers),
            "ring": ring,
            "last_seq": seq,
            "cut_off": self._cut_count,
            "most_queued": self._most_queued,
        }

    def wait_cut_off(self, count: int, timeout: float) -> bool:
        """Block (not on the server's loop) until ``count`` subscribers in all have
        been cut off; False if ``timeout`` seconds pass first."""
        with self._cut:
            return self._cut.wait_for(lambda: self._cut_count >= count, timeout)

    def close(self) -> None:
        """Stop listening to the node and cut every subscriber off (on the loop)."""
        self._unsubscribe()
        for sub in list(self._subscribers):
            sub.cut_off(reason="closed")
            self.unsubscribe(sub)
