"""Recovery on start (the Session Tree Model's ADR): read the store, decide what
comes back, write the endings of what cannot, and hand the Cortex its plan.

- Mains come back lazily: only their records are kept (``dormant``); an
  actor starts when a message or a call reaches one.
- Suspended branches come back (parents first) and run their skill again,
  with their context and ``session.resumed`` set, when resumed — at once for
  those a shutdown parked.
- Every other non-terminal session ends ``failed`` with ``node_restarted``;
  a suspended branch whose parent did not come back ends ``cancelled`` with
  ``parent_terminated``. Each ending writes its result where its parent will
  find it: in the outbox if the parent came back, filed on the parent if not,
  with what its usage record says it and its subtree spent.
- Results still in the outbox go to parents that came back (the receipt is
  their next snapshot) and are filed on parents that did not.
- A value that does not decode, or has an unknown schema version, is moved to
  the quarantine database, logged with its key and counted; recovery goes on.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from dataclasses import dataclass, field

import msgspec

from sessiontree.protocol import (
    CorruptRecordError,
    ErrorCode,
    ErrorInfo,
    SessionKind,
    SessionResult,
    SessionState,
    Timings,
    Usage,
)
from sessiontree.store import (
    InboxRecord,
    OutboxRecord,
    QuarantineRecord,
    SessionRecord,
    Store,
    UsageRecord,
    WriteBatch,
    decode_record,
)
from sessiontree.supervision._config import Agent

__all__ = ["Recovered", "recover"]

log = logging.getLogger("sessiontree.recovery")


@dataclass
class Recovered:
    """What recovery hands the Cortex."""

    dormant: dict[uuid.UUID, SessionRecord] = field(default_factory=dict)
    mains: dict[tuple[str, str], uuid.UUID] = field(default_factory=dict)
    suspended: list[SessionRecord] = field(default_factory=list)
    deliveries: dict[uuid.UUID, list[SessionResult]] = field(default_factory=dict)
    inbox: dict[uuid.UUID, list[InboxRecord]] = field(default_factory=dict)
    figures: collections.Counter[str] = field(default_factory=collections.Counter)


class _Recovery:
    def __init__(self, store: Store, agents: dict[str, Agent], now: float) -> None:
        self.store = store
        self.agents = agents
        self.now = now
        self.plan = Recovered()
        self.figures = self.plan.figures
        self.batch = WriteBatch()
        self.back: set[uuid.UUID] = set()  # sessions that come back after this restart

    def quarantine(self, db: str, error: CorruptRecordError, raw: bytes) -> None:
        log.error("quarantined %s record %s: %s", db, error.key.hex(), error)
        record = QuarantineRecord(db=db, key=error.key, raw=raw, reason=str(error), at=self.now)
        self.batch.quarantine(record)
        self.figures["quarantined"] += 1

    def live_sessions(self) -> list[SessionRecord]:
        live = []
        for key, raw in self.store.scan("sessions"):
            try:
                record = decode_record(SessionRecord, raw, db="sessions", key=key)
            except CorruptRecordError as exc:
                self.quarantine("sessions", exc, raw)
                continue
            if record.info.state.is_terminal:
                self.figures["terminal"] += 1
            else:
                live.append(record)
        live.sort(key=lambda r: r.info.depth)  # parents before children
        return live

    def decide(self, record: SessionRecord) -> SessionResult | None:
        """Bring ``record`` back, or end it and return the result it owes."""
        info = record.info
        agent = self.agents.get(info.agent_id)
        if agent is None:
            self.figures["unknown_agent"] += 1
            log.warning(
                "session %s belongs to unregistered agent %r; left as stored",
                info.session_id,
                info.agent_id,
            )
            return None
        if info.kind is SessionKind.MAIN:
            self.back.add(info.session_id)
            self.plan.dormant[info.session_id] = record
            self.figures["mains"] += 1
            return None
        suspended = info.state is SessionState.SUSPENDED
        if suspended and info.parent_id in self.back and info.skill in agent.skills:
            self.back.add(info.session_id)
            self.plan.suspended.append(record)
            self.figures["suspended"] += 1
            return None
        if suspended:
            state, code = SessionState.CANCELLED, ErrorCode.PARENT_TERMINATED
            why = "was suspended and its parent (or its skill) did not survive the restart"
            self.figures["orphans_cancelled"] += 1
        else:
            state, code = SessionState.FAILED, ErrorCode.NODE_RESTARTED
            why = "was running when the node stopped"
            self.figures["failed"] += 1
        spent = self.spent(info.session_id)
        result = SessionResult(
            session_id=info.session_id,
            status=state,
            parent_id=info.parent_id,
            kind=info.kind,
            error=ErrorInfo(code=code, message=f"session {info.session_id} {why}"),
            timings=Timings(created_at=info.created_at, ended_at=self.now),
            usage=spent.own if spent is not None else Usage(),
            subtree_usage=spent.subtree if spent is not None else Usage(),
        )
        ended = msgspec.structs.replace(info, state=state)
        self.batch.session(
            msgspec.structs.replace(record, info=ended, result=result, updated_at=self.now)
        )
        return result

    def spent(self, session_id: uuid.UUID) -> UsageRecord | None:
        """What the session's usage record says it spent (None: nothing, or a
        record that does not decode, which is quarantined)."""
        try:
            return self.store.usage(session_id)
        except CorruptRecordError as exc:
            raw = next((v for k, v in self.store.scan("usage", session_id.bytes)), b"")
            self.quarantine("usage", exc, raw)
            return None

    def owe(self, parent_id: uuid.UUID, result: SessionResult, *, in_outbox: bool) -> None:
        """Deliver to a parent that came back; file on one that did not."""
        if parent_id in self.back:
            if not in_outbox:
                self.batch.owe(parent_id, result)
            self.plan.deliveries.setdefault(parent_id, []).append(result)
        else:
            self.batch.file(parent_id, result)
            if in_outbox:
                self.batch.receipt(result.session_id)

    def run(self) -> Recovered:
        for record in self.live_sessions():
            result = self.decide(record)
            if result is not None and record.info.parent_id is not None:
                self.owe(record.info.parent_id, result, in_outbox=False)
        for key, raw in self.store.scan("outbox"):
            try:
                item = decode_record(OutboxRecord, raw, db="outbox", key=key)
            except CorruptRecordError as exc:
                self.quarantine("outbox", exc, raw)
                continue
            self.owe(item.parent_id, item.result, in_outbox=True)
            self.figures["outbox"] += 1
        for key, raw in self.store.scan("mains"):
            session_id = uuid.UUID(bytes=raw)
            if session_id in self.back:
                agent_id, _, session_key = key.decode().partition("\x00")
                self.plan.mains[(agent_id, session_key)] = session_id
        for key, raw in self.store.scan("inbox"):
            try:
                message = decode_record(InboxRecord, raw, db="inbox", key=key)
            except CorruptRecordError as exc:
                self.quarantine("inbox", exc, raw)
                continue
            if message.session_id in self.plan.dormant:
                self.plan.inbox.setdefault(message.session_id, []).append(message)
                self.figures["inbox"] += 1
        if self.batch:
            self.store.write(self.batch)
        self.store.quarantined += self.figures["quarantined"]
        return self.plan


def recover(store: Store, agents: dict[str, Agent], now: float) -> Recovered:
    """Read ``store`` and durably write the endings recovery decides, before the
    node takes work (``now``: wall-clock seconds). Raises ``StoreError`` if those
    writes fail; an unreadable record is quarantined, never fatal."""
    started = time.perf_counter()
    plan = _Recovery(store, agents, now).run()
    plan.figures["recovery_ms"] = int((time.perf_counter() - started) * 1000)
    if plan.figures["failed"] or plan.figures["suspended"] or plan.figures["quarantined"]:
        log.info("recovered %s", dict(plan.figures))
    return plan
