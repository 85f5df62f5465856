"""Every session a node knows, for listings and counts: what its index holds
(live sessions, dormant Mains, endings not yet evicted) and, with a store,
what only the store still holds (sessions that ended before a restart, or
were evicted from the index since).

So ``GET /v1/sessions``, ``GET /v1/node`` and ``sessiontree sessions ls
--node`` agree with ``--store`` before and after a restart. The index's view
of a session wins over its stored record (it is newer). The store is read on
a worker thread, never on the event loop; a record that does not decode is
left out (a restart quarantines it).
"""

from __future__ import annotations

import asyncio
import uuid

from sessiontree.protocol import SessionInfo, SessionKind, SessionState, SessionTreeError
from sessiontree.store import Store
from sessiontree.supervision import Node

__all__ = ["every_session"]


def _stored(store: Store, indexed: set[uuid.UUID]) -> list[SessionInfo]:
    return [
        record.info
        for record in store.sessions()
        if not isinstance(record, SessionTreeError) and record.info.session_id not in indexed
    ]


async def every_session(
    node: Node, state: SessionState | None = None, kind: SessionKind | None = None
) -> list[SessionInfo]:
    """The sessions of ``state`` and ``kind`` the node's index or its store
    holds (unsorted). Raises as ``Node.asessions`` does; a closing node is read
    off the event loop (its awaitable twins refuse it)."""
    if node.closed:
        indexed = await asyncio.to_thread(node.sessions)
    else:
        indexed = await node.asessions()
    infos = list(indexed)
    if node.store is not None:
        store = node.store
        infos += await asyncio.to_thread(_stored, store, {i.session_id for i in indexed})
    return [
        info
        for info in infos
        if (state is None or info.state is state) and (kind is None or info.kind is kind)
    ]
