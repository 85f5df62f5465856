"""``node.recovery``: what recovery found on start and what it held back, for
the operator: the figures and decisions, the node's wedged and stale work
(listed, requeued, dropped) and a replay held after repeated crashes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import msgspec

from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    RejectedInputError,
    SessionInfo,
    SessionKind,
    SpawnSpec,
    UnknownSessionError,
)
from sessiontree.store import Store, WedgedRecord, WriteBatch
from sessiontree.supervision._faces import offloaded
from sessiontree.supervision._node_core import NodeCore
from sessiontree.supervision._recovery import Recovered, RecoveryDecision
from sessiontree.supervision._requests import Redeliver, ReleaseReplay, Send

__all__ = ["Recovery", "Requeued"]


@dataclass(frozen=True, slots=True)
class Requeued:
    """What a requeue did: ``session_id`` runs the work again (the Main, or the
    fresh branch spawned in place of a wedged one); ``error`` when refused."""

    session_id: uuid.UUID | None
    error: ErrorInfo | None = None


def as_wedged_id(value: object) -> uuid.UUID:
    """A held-back item's id from a ``uuid.UUID`` or its string;
    ``RejectedInputError`` naming ``wedged_id`` otherwise."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    msg = f"{value!r} is not a wedged item's id"
    raise RejectedInputError(msg, field="wedged_id")


class Recovery:
    """``node.recovery``: what recovery found and held back (see ``NodeConfig``
    for the limits). Its store reads and writes block the calling thread
    (``awedged_sessions`` runs them on a worker thread)."""

    __slots__ = ("_node", "decisions", "figures")

    def __init__(self, node: NodeCore, recovered: Recovered | None) -> None:
        self._node = node
        self.figures: dict[str, int] = {} if recovered is None else dict(recovered.figures)
        """What recovery found on start (empty without a store): mains, suspended,
        failed, quarantined, terminal, results owed, decisions (fresh, stale,
        wedged), recent crashes, ``recovery_ms``…"""
        self.decisions: list[RecoveryDecision] = (
            [] if recovered is None else list(recovered.decisions)
        )
        """Each decision recovery took beyond a plain first run: replays after a
        crash, work held back as stale or wedged (``RecoveryDecision``)."""
        node._parts.replay_held = None if recovered is None else recovered.held

    @property
    def _store(self) -> Store | None:
        return self._node.store

    @property
    def replay_held(self) -> str | None:
        """Why this start holds replay back (the node kept crashing), or None;
        ``release_replay()`` runs it."""
        return self._node._parts.replay_held

    def wedged(self) -> list[WedgedRecord]:
        """Work recovery held back (wedged or stale), oldest first; empty
        without a store."""
        return [] if self._store is None else self._store.wedged_list()

    def wedged_sessions(self) -> list[SessionInfo]:
        """The sessions holding held-back work (a Main with a wedged message or
        result, a wedged branch), in the order of their oldest item."""
        found = []
        for session_id in dict.fromkeys(item.session_id for item in self.wedged()):
            try:
                found.append(self._node.get(session_id))
            except UnknownSessionError:  # pruned from the store since
                continue
        return found

    awedged_sessions = offloaded(wedged_sessions)  # its store reads run off the loop

    def wedged_item(self, wedged_id: uuid.UUID | str) -> WedgedRecord | None:
        """One held-back item, or None."""
        if self._store is None:
            return None
        return self._store.wedged(as_wedged_id(wedged_id))

    def requeue(self, wedged_id: uuid.UUID | str) -> Requeued:
        """Run held-back work again, as a first attempt: a message goes back to
        its Main's inbox (in the commit that drops the held item), a result runs
        its Main's cycle again, a wedged branch is spawned afresh under its
        parent (a new session: every run is a fresh one) with its task, context
        summary, skill, metadata and input. A refusal comes back in ``Requeued.error``
        (``unknown_session`` for an id not held, the Main's or the spawn's own
        error) and leaves the item held."""
        item = self.wedged_item(wedged_id)
        if item is None:
            missing = ErrorInfo(
                code=ErrorCode.UNKNOWN_SESSION, message=f"no held-back item {wedged_id}"
            )
            return Requeued(None, missing)
        if item.kind == "message":
            send = Send(
                item.session_id, item.message, unwedge=item.wedged_id, message_id=item.message_id
            )
            error = self._node._call(send)
            return Requeued(item.session_id, error)
        if item.kind == "result" and item.result is not None:
            error = self._node._call(Redeliver(item.session_id, item.result, item.wedged_id))
            return Requeued(item.session_id, error)
        if item.kind == "branch":
            return self._requeue_branch(item)
        unreadable = ErrorInfo(
            code=ErrorCode.CORRUPT_RECORD,
            message=f"held-back item {item.wedged_id} is a {item.kind!r} this node cannot run",
        )
        return Requeued(None, unreadable)

    def _requeue_branch(self, item: WedgedRecord) -> Requeued:
        store = self._store
        assert store is not None  # an item was read from it
        record = store.session(item.session_id)
        if record is None or record.info.parent_id is None:
            gone = ErrorInfo(
                code=ErrorCode.UNKNOWN_SESSION,
                message=f"the wedged branch {item.session_id} is no longer in the store",
            )
            return Requeued(None, gone)
        info, parent_id = record.info, record.info.parent_id
        spec = SpawnSpec(
            kind=SessionKind.BRANCH,
            task=info.task,
            context_summary=info.context_summary,
            skill=info.skill or None,
            model_tier=info.model_tier,
            metadata=dict(info.metadata),
            budget=info.budget,
            input=info.input,
        )
        spawned = self._node.spawn(parent_id, spec)
        if spawned.error is not None:
            return Requeued(None, spawned.error)
        store.write(WriteBatch().unwedge(item.wedged_id))
        return Requeued(spawned.session_id)

    def drop_wedged(self, wedged_id: uuid.UUID | str) -> bool:
        """Forget a held-back item for good; False if no such item was held (a
        node without a store holds none)."""
        sid = as_wedged_id(wedged_id)
        store = self._store
        if store is None or store.wedged(sid) is None:
            return False
        store.write(WriteBatch().unwedge(sid))
        return True

    def release_replay(self) -> int:
        """Run what a held replay kept back (after repeated crashes: see
        ``replay_held``), and retry at once the Main cycles a store refusal
        kept (see ``store_held_mains`` in ``stats``); how many pieces of work
        were released. The crashes counted so far are forgiven: the next start
        holds replay back only if the node crashes ``restart_intensity`` times
        again."""
        node, store = self._node, self._store
        released: int = node._call(ReleaseReplay(), check=False)
        if store is not None:
            starts = store.starts()
            if starts is not None and starts.crashes:
                store.write(WriteBatch().starts(msgspec.structs.replace(starts, crashes=[])))
        node._parts.replay_held = None
        self.figures["replay_held"] = 0
        return released
