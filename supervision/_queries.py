"""Questions about the tree, answered from the index and, for sessions it no
longer holds, from the store. None of them wakes a dormant Main except
``await_result`` on one (it can still end).

Each raises ``UnknownSessionError`` for a session neither holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pykka

from sessiontree.actors.runtime import Reply, SessionCore
from sessiontree.protocol import (
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    Spending,
    UnknownSessionError,
)
from sessiontree.store import SessionRecord
from sessiontree.supervision._commits import answer_durable
from sessiontree.supervision._entry import TreeEntry, with_state
from sessiontree.supervision._requests import DEFERRED
from sessiontree.supervision._spending import stored_spending, tree_spending
from sessiontree.supervision._tree import Tree

__all__ = [
    "actor_ref",
    "await_result",
    "forget_waiter",
    "info",
    "probe_parked",
    "received",
    "result",
    "sessions",
    "spending",
    "stats",
    "stuck",
    "subtree",
]


def info(tree: Tree, session_id: uuid.UUID) -> SessionInfo:
    """The session's identity with its current state."""
    known = tree.known(session_id)
    return known.info if isinstance(known, SessionRecord) else with_state(known)


def await_result(tree: Tree, session_id: uuid.UUID, reply: Reply) -> object:
    """Answer ``reply`` with the session's result once it has one (and its
    terminal write is durable): now, or ``DEFERRED`` until it ends."""
    known = tree.known(session_id)
    if isinstance(known, SessionRecord):
        if known.result is not None:
            return known.result
        known = tree.lookup(session_id)  # a dormant Main: it can still end
    if known.result is not None:
        answer_durable(known, reply, tree.persist)
    else:
        known.waiters.append(reply)
    return DEFERRED


def forget_waiter(tree: Tree, session_id: uuid.UUID, reply: Reply) -> None:
    """Drop a waiter whose caller gave up (its timeout passed)."""
    entry = tree.entries.get(session_id)
    if entry is not None and reply in entry.waiters:
        entry.waiters.remove(reply)


def result(tree: Tree, session_id: uuid.UUID) -> SessionResult | None:
    """The session's result if it has ended, else None."""
    return tree.known(session_id).result


def spending(tree: Tree, session_id: uuid.UUID) -> Spending:
    """The session's accounts: usage, its subtree's, budget and what is left."""
    return _spending(tree, tree.known(session_id))


def _spending(tree: Tree, known: TreeEntry | SessionRecord) -> Spending:
    if isinstance(known, TreeEntry):
        return tree_spending(known.ledger, known.result)
    session_id = known.info.session_id
    at_rest = tree.ledgers_at_rest.get(session_id)  # a passivated Main's
    if at_rest is not None:
        return tree_spending(at_rest, None)
    store = tree.store
    spent = None
    if store is not None:  # an ended session's too: calls may have settled after its end
        spent = store.usage(session_id, set_aside=True)  # unreadable: set aside, none
    return stored_spending(known, spent)


def received(tree: Tree, session_id: uuid.UUID) -> list[SessionResult]:
    """The results this session has received (most recent ``max_retained_results``)."""
    known = tree.known(session_id)
    if isinstance(known, SessionRecord):
        return tree.store.received(session_id, set_aside=True) if tree.store is not None else []
    with known.core.cond:
        return list(known.core.received)


def subtree(tree: Tree, session_id: uuid.UUID) -> dict[str, Any]:
    """The subtree under ``session_id`` as nested dicts (info, result, spending,
    children); sessions that ended before a restart come from the store."""
    store = tree.store

    def node(known: TreeEntry | SessionRecord) -> dict[str, Any]:
        if isinstance(known, SessionRecord):
            info, result = known.info, known.result
            child_ids: list[uuid.UUID] = []
        else:
            info, result = with_state(known), known.result
            child_ids = list(known.children)
        if store is not None:
            seen = set(child_ids)
            child_ids += [c for c in store.children(info.session_id) if c not in seen]
        children = []
        for child_id in child_ids:
            try:
                children.append(node(tree.known(child_id)))
            except UnknownSessionError:  # pruned, or evicted without a store
                continue
        return {
            "info": info,
            "result": result,
            "spending": _spending(tree, known),
            "children": children,
        }

    return node(tree.known(session_id))


def sessions(tree: Tree, state: SessionState | None, kind: SessionKind | None) -> list[SessionInfo]:
    """Every session the index holds (dormant Mains included), optionally filtered."""
    infos = [with_state(e) for e in tree.entries.values()]
    infos += [record.info for record in tree.dormant.values()]
    return [
        info
        for info in infos
        if (state is None or info.state is state) and (kind is None or info.kind is kind)
    ]


def actor_ref(tree: Tree, session_id: uuid.UUID) -> pykka.ActorRef[Any] | None:
    """The session's actor (None once it ended, or while a Main is dormant: a
    diagnostic never wakes one), for diagnostics and tests."""
    known = tree.known(session_id)
    return None if isinstance(known, SessionRecord) else known.ref


def probe_parked(
    tree: Tree, session_id: uuid.UUID, probe: Callable[[SessionCore], object]
) -> tuple[bool, object, Exception | None]:
    """``(True, probe(core), None)`` for a live session holding no actor (a
    parked branch), run on this thread, or ``(True, None, error)`` if the
    probe raised; ``(False, None, None)`` otherwise."""
    entry = tree.entries.get(session_id)
    if entry is None or entry.ref is not None or entry.state.is_terminal:
        return False, None, None
    try:
        return True, probe(entry.core), None
    except Exception as exc:  # noqa: BLE001 - the caller's probe: handed back to it
        return True, None, exc


def stuck(tree: Tree) -> list[SessionInfo]:
    """Live sessions flagged as stuck (no checkpoint for ``stuck_after``); one
    that ended since (forced, or returned without a checkpoint) is not."""
    return [
        with_state(e) for e in tree.entries.values() if e.core.stuck and not e.state.is_terminal
    ]


def stats(tree: Tree) -> dict[str, int]:
    """Counters and gauges of the tree."""
    rt = tree.rt
    figures = dict(rt.counters)
    figures.update(
        live_sessions=tree.live,
        indexed_sessions=len(tree.entries),
        dormant_sessions=len(tree.dormant),
        zombies=tree.zombies + tree.main_zombies,
        sync_threads=tree.sync_threads,
        slots_in_use=rt.slots.in_use,
        slots_waiting=rt.slots.waiting,
        result_waiters=sum(len(e.waiters) for e in tree.entries.values()),
        session_mailbox_depth=sum(
            _inbox_depth(e.ref) for e in tree.entries.values() if e.ref is not None
        ),
    )
    return figures


def _inbox_depth(ref: pykka.ActorRef[Any]) -> int:
    """Messages waiting in an actor's inbox (0 for an inbox that cannot say)."""
    qsize = getattr(ref.actor_inbox, "qsize", None)
    return int(qsize()) if callable(qsize) else 0
