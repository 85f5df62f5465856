"""``GET /v1/events``: the node's events as server-sent events.

Each message has ``id:`` (the event's number, increasing), ``event:`` (its
type, an ``EventKind`` value) and ``data:`` (one JSON object: ``seq``,
``type``, ``session_id``, ``parent_id``, ``agent``, ``kind``, ``at``,
``state``, ``previous``, ``code``, ``data``). Without ``Last-Event-ID`` or
``since`` the stream starts with the next event; with either, it first sends
the events after that number that the ring still holds, preceded by one
``missed`` message (no ``id``) when some were let go. A subscriber that falls
``queue_size`` events behind is sent a final ``overflow`` message (no ``id``:
reconnecting with the last id resumes from the ring) and the stream ends;
a node closing ends every stream with a ``closed`` message. A comment
(``: keep-alive``) goes out after every quiet ``heartbeat`` seconds.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import get
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.params import HeaderParameter, QueryParameter
from litestar.response import Stream

from sessiontree.cli.server._errors import ERRORS
from sessiontree.cli.server._event_hub import EventFilter, EventHub, Subscriber, _Item
from sessiontree.cli.server._shared import node_of
from sessiontree.protocol import RejectedInputError, SessionKind, UnknownAgentError
from sessiontree.supervision import EventKind

__all__ = ["EVENT_ROUTES", "HEARTBEAT"]

HEARTBEAT = 15.0  # seconds of quiet before a keep-alive comment
_CHUNK = 256  # events a write carries at most when the ring is replayed
_TYPES = frozenset(k.value for k in EventKind)
_ONE_TYPE = "|".join(sorted(_TYPES))
# Litestar leaves the bounds of an optional parameter out of its schema: said here
_TYPE_ITEMS = {"items": {"type": "string", "pattern": f"^({_ONE_TYPE})(,({_ONE_TYPE}))*$"}}
_NUMBER = {"minimum": 0}


def _types(raw: list[str] | None) -> frozenset[str] | None:
    if not raw:
        return None
    wanted = frozenset(part.strip() for text in raw for part in text.split(",") if part.strip())
    unknown = sorted(wanted - _TYPES)
    if unknown:
        msg = f"unknown event type {unknown[0]!r} (known: {', '.join(sorted(_TYPES))})"
        raise RejectedInputError(msg, field="type")
    return wanted or None


def _subtree(tree: dict[str, Any]) -> set[uuid.UUID]:
    ids: set[uuid.UUID] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        ids.add(node["info"].session_id)
        stack.extend(node["children"])
    return ids


def _message(event: str, data: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event.encode(), msgspec.json.encode(data))


def _missed(missed: int | None, after: int, oldest: int | None) -> bytes:
    if missed is None:
        text = f"event {after} is newer than this node's latest: it restarted since"
    else:
        text = f"{missed} events after {after} are no longer held"
    return _message(
        "missed", {"missed": missed, "after": after, "first_held": oldest, "message": text}
    )


async def _follow(
    hub: EventHub,
    flt: EventFilter,
    after: int,
    subtree: set[uuid.UUID],
    *,
    follow: bool,
    heartbeat: float,
) -> AsyncIterator[bytes]:
    """The stream of one subscriber: registered on first iteration (so a client
    gone before the stream started leaves nothing behind), unregistered in
    ``finally`` (a disconnect cancels the iteration)."""
    sub, held, missed = hub.subscribe(flt, after, subtree, register=follow)
    try:
        yield b": events after %d\n\n" % after
        if missed != 0:
            yield _missed(missed, after, held[0].seq if held else None)
        delivered = after
        for start in range(0, len(held), _CHUNK):
            part = held[start : start + _CHUNK]
            yield b"".join(item.wire() for item in part)
            delivered = part[-1].seq
        if not follow:
            return
        async for chunk in _live(sub, delivered, heartbeat):
            yield chunk
    finally:
        hub.unsubscribe(sub)


async def _live(sub: Subscriber, delivered: int, heartbeat: float) -> AsyncIterator[bytes]:
    while True:
        if not sub.queue and not sub.cut:
            sub.wake.clear()
            try:
                await asyncio.wait_for(sub.wake.wait(), heartbeat)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
        if sub.queue:
            items: list[_Item] = list(sub.queue)
            sub.queue.clear()
            delivered = items[-1].seq
            yield b"".join(item.wire() for item in items)
        if sub.cut:
            yield _final(sub, delivered)
            return


def _final(sub: Subscriber, delivered: int) -> bytes:
    if sub.reason == "closed":
        return _message("closed", {"last_id": delivered, "message": "the node is closing"})
    text = (
        f"this consumer fell {sub.bound} events behind and was cut off; "
        f"reconnect with Last-Event-ID {delivered} to resume from the ring"
    )
    return _message(
        "overflow",
        {"last_id": delivered, "dropped": sub.dropped, "queue_size": sub.bound, "message": text},
    )


class StreamedEvent(msgspec.Struct, kw_only=True):
    """One message of the stream, as its fields: ``id`` (absent on ``missed``,
    ``overflow`` and ``closed``), ``event`` (the type) and ``data`` (the JSON
    object, as text)."""

    event: str
    data: str
    id: str | None = None


_STREAM_DOC = ResponseSpec(
    data_container=StreamedEvent,
    media_type="text/event-stream",
    description="Server-sent events: `id:` the event's number, `event:` its type, `data:` "
    "one JSON object (seq, type, session_id, parent_id, agent, kind, at, state, previous, "
    "code, data); `missed`, `overflow` and `closed` messages carry no id.",
)


@get(
    "/events",
    tags=["events"],
    media_type="text/event-stream",
    responses={200: _STREAM_DOC, **ERRORS},
)
async def events(
    state: State,
    root: Annotated[
        uuid.UUID | None,
        QueryParameter(description="Only this session and its descendants."),
    ] = None,
    agent: Annotated[
        str | None,
        QueryParameter(max_length=128, description="Only this agent's sessions."),
    ] = None,
    kind: Annotated[SessionKind | None, QueryParameter(description="Only this kind.")] = None,
    types: Annotated[
        list[str] | None,
        QueryParameter(
            name="type",
            description="Only these event types (repeat, or separate with commas).",
            schema_extra=_TYPE_ITEMS,
        ),
    ] = None,
    since: Annotated[
        int | None,
        QueryParameter(
            ge=0,
            description="Resume after this event number (as Last-Event-ID).",
            schema_extra=_NUMBER,
        ),
    ] = None,
    follow: Annotated[
        bool,
        QueryParameter(
            description="Keep the stream open for new events (false: the ring, then end)."
        ),
    ] = True,
    last_event_id: Annotated[
        int | None,
        HeaderParameter(
            name="Last-Event-ID",
            ge=0,
            description="Resume after this event number.",
            schema_extra=_NUMBER,
        ),
    ] = None,
) -> Stream:
    """Follow the node's events as server-sent events, filtered by subtree
    (``root``), ``agent``, ``kind`` and ``type``; resume with ``Last-Event-ID``
    (or ``since``) from the ring of recent events.

    A bad filter is a 400 naming the parameter; an unknown ``root`` a 404, an
    unknown ``agent`` a 404 ``unknown_agent``."""
    node = node_of(state)
    hub: EventHub = state.events
    wanted = _types(types)
    if agent is not None and agent not in node.agents:
        msg = f"no agent {agent!r} on this node (agents: {', '.join(sorted(node.agents))})"
        raise UnknownAgentError(msg, field="agent")
    after = last_event_id if last_event_id is not None else since
    if after is None:
        after = hub.last_seq
    subtree = _subtree(await node.atree(root)) if root is not None else set()
    flt = EventFilter(
        root=root, agent=agent, kind=None if kind is None else kind.value, types=wanted
    )
    return Stream(
        _follow(hub, flt, after, subtree, follow=follow, heartbeat=state.event_heartbeat),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


EVENT_ROUTES = (events,)
"""Served under ``/v1``."""
