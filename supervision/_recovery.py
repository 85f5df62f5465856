"""Recovery on start (ARCHITECTURE.md, "Persistence"): read the store, decide what
comes back, write the endings of what cannot, and hand the Cortex its plan.

- Mains come back lazily: only their records are kept (``dormant``); an
  actor starts when a message or a call reaches one.
- Suspended branches come back (parents first) and run their skill again,
  with their context and ``session.resumed`` set, when resumed — at once for
  those a shutdown parked.
- Work a crash may have cut off — a Main's acknowledged messages and owed
  results (the one its cycle mark names was running), a branch a shutdown
  parked — is classified (``_recovery_rules``): *fresh* runs again as its
  next attempt (counted durably before it runs), *stale* and *wedged* are
  held back in the ``wedged`` database for the operator (a branch also ends:
  ``expired``, or ``failed`` with ``wedged``, its parent told once). Each
  decision is logged, counted and listed (``decisions``).
- A node whose recent runs kept crashing holds every replay back (``held``).
- Every other non-terminal session ends ``failed`` with ``node_restarted``;
  a suspended branch whose parent did not come back ends ``cancelled`` with
  ``parent_terminated``. Each ending writes its result where its parent will
  find it: in the outbox if the parent came back, filed on the parent if not,
  with what its usage record says it and its subtree spent.
- Results still in the outbox go to parents that came back (the receipt is
  their next snapshot) and are filed on parents that did not.
- A value that does not decode (any failure of its bytes), or has an unknown
  schema version, is moved to the quarantine database, logged with its key
  and counted; recovery goes on. Recovery reads, and so cleans, the sessions,
  cycle marks, the outbox, Mains by key, the inbox, the results filed on
  sessions (``received``), usage records, held-back work and the node's
  starts; what is read later (conversations, memory, recordings) is a typed
  ``CorruptRecordError`` where it is read.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

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
    new_session_id,
    slot_of,
)
from sessiontree.store import (
    CallRecord,
    CycleRecord,
    InboxRecord,
    OutboxRecord,
    QuarantineRecord,
    SessionRecord,
    StartsRecord,
    Store,
    UsageRecord,
    WedgedRecord,
    WriteBatch,
    decode_id,
    decode_record,
)
from sessiontree.supervision._config import Agent, NodeConfig
from sessiontree.supervision._recovery_rules import (
    Decision,
    Verdict,
    classify,
    crashes_after_start,
    hold_replay,
)
from sessiontree.supervision._recovery_summary import recovery_summary, recovery_summary_line

__all__ = ["Recovered", "RecoveryDecision", "recover"]

log = logging.getLogger("sessiontree.recovery")

_R = TypeVar("_R", bound=msgspec.Struct)


@dataclass(frozen=True, slots=True)
class RecoveryDecision:
    """One decision recovery took: what (``kind``: message, result or branch;
    the session, and the message's ``seq`` or the result's ``child_id``),
    ``decision`` (fresh, stale or wedged), why, and the attempt a fresh run is."""

    kind: str
    session_id: uuid.UUID
    decision: str
    reason: str
    attempt: int
    seq: int | None = None
    child_id: uuid.UUID | None = None
    wedged_id: uuid.UUID | None = None


@dataclass
class Recovered:
    """What recovery hands the Cortex. ``attempts``: the attempt a replayed
    inbox message (main id, seq) or owed result (child id) runs as, when not 1.
    ``held``: why replay is held back (None: it is not)."""

    dormant: dict[uuid.UUID, SessionRecord] = field(default_factory=dict)
    mains: dict[tuple[str, str], uuid.UUID] = field(default_factory=dict)
    suspended: list[SessionRecord] = field(default_factory=list)
    deliveries: dict[uuid.UUID, list[SessionResult]] = field(default_factory=dict)
    inbox: dict[uuid.UUID, list[InboxRecord]] = field(default_factory=dict)
    attempts: dict[object, int] = field(default_factory=dict)
    cut_off: dict[object, str] = field(default_factory=dict)  # keyed as attempts: the span
    decisions: list[RecoveryDecision] = field(default_factory=list)
    held: str | None = None
    figures: collections.Counter[str] = field(default_factory=collections.Counter)


class _Recovery:
    def __init__(
        self, store: Store, agents: dict[str, Agent], now: float, config: NodeConfig
    ) -> None:
        self.store = store
        self.agents = agents
        self.now = now
        self.config = config
        self.plan = Recovered()
        self.figures = self.plan.figures
        self.batch = WriteBatch()
        self.back: set[uuid.UUID] = set()  # sessions that come back after this restart
        self.cycles: dict[uuid.UUID, CycleRecord] = {}  # a Main's cycle in flight at the crash
        self.set_aside: set[tuple[str, bytes]] = set()  # (db, key) quarantined in this batch

    def lost_calls(self) -> list[CallRecord]:
        """The model calls the stopped node left in flight (``CallRecord``); one
        that does not decode is quarantined (its chain unknown, it counts nowhere)."""
        return list(self.decoded("calls", CallRecord))

    def quarantine(self, db: str, error: CorruptRecordError, raw: bytes) -> None:
        """Move the value aside in this recovery's batch (once per entry: a later
        read of the same entry finds it in ``self.set_aside``)."""
        if (db, error.key) in self.set_aside:
            return
        self.set_aside.add((db, error.key))
        log.error("quarantined %s record %s: %s", db, error.key.hex(), error)
        record = QuarantineRecord(db=db, key=error.key, raw=raw, reason=str(error), at=self.now)
        self.batch.quarantine(record)
        self.figures["quarantined"] += 1

    def decoded(self, db: str, kind: type[_R]) -> Iterator[_R]:
        """Every entry of ``db`` decoded as ``kind``; one that does not decode is
        quarantined and skipped."""
        for key, raw in self.store.scan(db):
            try:
                yield decode_record(kind, raw, db=db, key=key)
            except CorruptRecordError as exc:
                self.quarantine(db, exc, raw)

    def check(self, db: str, kind: type[msgspec.Struct]) -> None:
        """Decode every entry of ``db`` as ``kind``, quarantining those that do not
        (the entries later reads of the node would otherwise fail on)."""
        for _ in self.decoded(db, kind):
            pass

    def live_sessions(self) -> list[SessionRecord]:
        """The sessions not yet terminal, read through the index of live sessions
        the writer keeps with the records: start-up reads what is live, never
        the ended (they are read when asked for). An index entry whose record
        is gone or ended is dropped."""
        live = []
        for key, raw in self.store.live_records():
            if raw is None:
                self.batch.raw_delete("live", key)
                continue
            try:
                record = decode_record(SessionRecord, raw, db="sessions", key=key)
            except CorruptRecordError as exc:
                self.quarantine("sessions", exc, raw)
                continue
            if record.info.state.is_terminal:
                self.batch.raw_delete("live", key)
            else:
                live.append(record)
        self.figures["terminal"] = self.store.count("sessions") - len(live)
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
            return self.decide_suspended(record)
        if suspended:
            state, code = SessionState.CANCELLED, ErrorCode.PARENT_TERMINATED
            why = "was suspended and its parent (or its skill) did not survive the restart"
            self.figures["orphans_cancelled"] += 1
        else:
            state, code = SessionState.FAILED, ErrorCode.NODE_RESTARTED
            why = "was running when the node stopped"
            self.figures["failed"] += 1
        return self.end(
            record, state, ErrorInfo(code=code, message=f"session {info.session_id} {why}")
        )

    def decide_suspended(self, record: SessionRecord) -> SessionResult | None:
        """A suspended branch whose parent came back: back as it was, unless it is
        stale (its TTL ran out: it ends ``expired``) or, parked by a shutdown and
        run again after each restart, crashes cut it off too often (``wedged``)."""
        info = record.info
        verdict = classify(
            attempts=record.attempts if record.resume else 0,
            created_at=info.created_at,
            deadline=info.deadline,
            now=self.now,
            max_attempts=self.config.recovery_attempts,
            max_age=self.config.recovery_max_age,
        )
        if verdict.decision is Decision.FRESH:
            self.back.add(info.session_id)
            if record.resume and self.plan.held is None:  # it runs at once: the
                # attempt is counted before it does (held, it does not run yet)
                self.note("branch", info.session_id, verdict)
                record = msgspec.structs.replace(record, attempts=verdict.attempt)
                self.batch.session(record)
            self.plan.suspended.append(record)
            self.figures["suspended"] += 1
            return None
        wedged_id = None
        if verdict.decision is Decision.WEDGED:
            state, code = SessionState.FAILED, ErrorCode.WEDGED
            wedged_id = self.hold("branch", info.session_id, info.agent_id, verdict)
        elif info.deadline is not None and self.now >= info.deadline:
            state, code = SessionState.EXPIRED, ErrorCode.TTL_EXPIRED
        else:
            state, code = SessionState.FAILED, ErrorCode.NODE_RESTARTED
        self.note("branch", info.session_id, verdict, wedged_id=wedged_id)
        message = f"session {info.session_id}: {verdict.reason}"
        return self.end(record, state, ErrorInfo(code=code, message=message))

    def end(self, record: SessionRecord, state: SessionState, error: ErrorInfo) -> SessionResult:
        """Write ``record``'s end; the result it owes its parent."""
        info = record.info
        spent = self.spent(info.session_id)
        result = SessionResult(
            session_id=info.session_id,
            status=state,
            parent_id=info.parent_id,
            kind=info.kind,
            error=error,
            timings=Timings(created_at=info.created_at, ended_at=self.now),
            usage=spent.own if spent is not None else Usage(),
            subtree_usage=spent.subtree if spent is not None else Usage(),
        )
        ended = msgspec.structs.replace(info, state=state)
        self.batch.session(
            msgspec.structs.replace(
                record, info=ended, result=result, updated_at=self.now, resume=False
            )
        )
        return result

    def note(
        self,
        kind: str,
        session_id: uuid.UUID,
        verdict: Verdict,
        *,
        seq: int | None = None,
        child_id: uuid.UUID | None = None,
        wedged_id: uuid.UUID | None = None,
    ) -> None:
        """Log, count and list one decision (a fresh first run is only counted)."""
        decision = RecoveryDecision(
            kind=kind,
            session_id=session_id,
            decision=verdict.decision.value,
            reason=verdict.reason,
            attempt=verdict.attempt,
            seq=seq,
            child_id=child_id,
            wedged_id=wedged_id,
        )
        self.figures[verdict.decision.value] += 1
        if verdict.decision is Decision.FRESH and verdict.attempt == 1:
            return
        self.plan.decisions.append(decision)
        where = f" seq {seq}" if seq is not None else f" child {child_id}" if child_id else ""
        level = logging.INFO if verdict.decision is Decision.FRESH else logging.WARNING
        log.log(
            level,
            "recovery: %s of session %s%s is %s (attempt %d): %s",
            kind,
            session_id,
            where,
            verdict.decision.value,
            verdict.attempt,
            verdict.reason,
        )

    def hold(
        self,
        kind: str,
        session_id: uuid.UUID,
        agent_id: str,
        verdict: Verdict,
        *,
        inbox: InboxRecord | None = None,
        result: SessionResult | None = None,
    ) -> uuid.UUID:
        """Put work aside in the ``wedged`` database; its id."""
        wedged_id = new_session_id(slot_of(session_id))  # in its session's slot
        self.batch.wedged(
            WedgedRecord(
                wedged_id=wedged_id,
                kind=kind,
                session_id=session_id,
                agent_id=agent_id,
                attempts=verdict.attempt,
                reason=f"{verdict.decision.value}: {verdict.reason}",
                at=self.now,
                seq=inbox.seq if inbox is not None else None,
                message=inbox.message if inbox is not None else None,
                received_at=inbox.received_at if inbox is not None else None,
                result=result,
                message_id=inbox.id if inbox is not None else None,
            )
        )
        return wedged_id

    def spent(self, session_id: uuid.UUID) -> UsageRecord | None:
        """What the session's usage record says it spent (None: nothing, or a
        record that does not decode, quarantined here)."""
        if ("usage", session_id.bytes) in self.set_aside:
            return None
        try:
            return self.store.usage(session_id)
        except CorruptRecordError as exc:
            raw = next((v for k, v in self.store.scan("usage", exc.key) if k == exc.key), b"")
            self.quarantine("usage", exc, raw)  # in recovery's own batch
            return None

    def owe(self, parent_id: uuid.UUID, result: SessionResult, *, in_outbox: bool) -> None:
        """Deliver to a parent that came back; file on one that did not."""
        if parent_id in self.back:
            if not in_outbox:
                self.batch.owe(parent_id, result)
            elif parent_id in self.plan.dormant and not self.result_cycle(parent_id, result):
                return  # held back: filed on the Main, no cycle runs for it
            self.plan.deliveries.setdefault(parent_id, []).append(result)
        else:
            self.batch.file(parent_id, result)
            if in_outbox:
                self.batch.receipt(result.session_id)

    def classify_cycle(self, main_id: uuid.UUID, attempts: int, created_at: float) -> Verdict:
        return classify(
            attempts=attempts,
            created_at=created_at,
            deadline=None,
            now=self.now,
            max_attempts=self.config.recovery_attempts,
            max_age=self.config.recovery_max_age,
        )

    def result_cycle(self, main_id: uuid.UUID, result: SessionResult) -> bool:
        """A result owed to a Main from before the restart: True to run its cycle
        (as which attempt goes in the plan); False if it is held back."""
        mark = self.cycles.get(main_id)
        cut_off = mark is not None and mark.child_id == result.session_id
        timings = result.timings
        ended_at = timings.ended_at if timings is not None and timings.ended_at else self.now
        verdict = self.classify_cycle(main_id, mark.attempt if cut_off and mark else 0, ended_at)
        if verdict.decision is Decision.FRESH:
            if verdict.attempt > 1:
                self.plan.attempts[result.session_id] = verdict.attempt
                if mark is not None and mark.trace is not None:
                    self.plan.cut_off[result.session_id] = mark.trace
                self.keep_mark(main_id)
            self.note("result", main_id, verdict, child_id=result.session_id)
            return True
        agent_id = self.plan.dormant[main_id].info.agent_id
        wedged_id = self.hold("result", main_id, agent_id, verdict, result=result)
        self.note("result", main_id, verdict, child_id=result.session_id, wedged_id=wedged_id)
        self.batch.file(main_id, result).receipt(result.session_id)
        return False

    def inbox_message(self, message: InboxRecord) -> None:
        """An acknowledged message of a Main that came back: replayed, or held back."""
        main_id = message.session_id
        mark = self.cycles.get(main_id)
        cut_off = mark is not None and mark.seq == message.seq
        attempts = mark.attempt if cut_off and mark is not None else 0
        verdict = self.classify_cycle(main_id, attempts, message.received_at)
        if verdict.decision is Decision.FRESH:
            if verdict.attempt > 1:
                self.plan.attempts[(main_id, message.seq)] = verdict.attempt
                if mark is not None and mark.trace is not None:
                    self.plan.cut_off[(main_id, message.seq)] = mark.trace
                self.keep_mark(main_id)
            self.note("message", main_id, verdict, seq=message.seq)
            self.plan.inbox.setdefault(main_id, []).append(message)
            self.figures["inbox"] += 1
            return
        agent_id = self.plan.dormant[main_id].info.agent_id
        wedged_id = self.hold("message", main_id, agent_id, verdict, inbox=message)
        self.note("message", main_id, verdict, seq=message.seq, wedged_id=wedged_id)
        self.batch.consumed(main_id, message.seq)

    def read_cycles(self) -> None:
        for mark in self.decoded("cycles", CycleRecord):
            self.cycles[mark.session_id] = mark
            if self.plan.held is None:  # what it marked is decided here: held back, or
                # run again (``keep_mark``); a held replay keeps the count for later
                self.batch.cycle_done(mark.session_id)

    def keep_mark(self, main_id: uuid.UUID) -> None:
        """The cycle ``main_id``'s mark names runs again: the mark stays (put back
        after ``read_cycles`` dropped it) until that rerun's own mark replaces
        it, so a crash before the rerun starts still counts the attempts."""
        self.batch.cycle(self.cycles[main_id])

    def restart_intensity(self) -> None:
        """Record this start; hold replay back if recent runs kept crashing."""
        config = self.config
        try:
            previous = self.store.starts() or StartsRecord()
        except CorruptRecordError as exc:
            raw = next((v for k, v in self.store.scan("meta", b"starts") if k == b"starts"), b"")
            self.quarantine("meta", exc, raw)
            previous = StartsRecord()
        crashes = crashes_after_start(
            previous_running=previous.running,
            previous_start=previous.started_at,
            crashes=previous.crashes,
            now=self.now,
            period=config.restart_period,
        )
        self.plan.held = hold_replay(
            crashes, intensity=config.restart_intensity, period=config.restart_period
        )
        self.figures["recent_crashes"] = len(crashes)
        if self.plan.held is not None:
            self.figures["replay_held"] = 1
            log.error("recovery: %s", self.plan.held)
        self.batch.starts(StartsRecord(running=True, started_at=self.now, crashes=crashes))

    def run(self) -> Recovered:
        # First: what the sessions spent, with the calls a crash left in flight
        # counted at their worst case, is what the endings below report.
        lost = self.lost_calls()
        settle_lost_calls(self.store, lost)
        if lost:
            self.figures["lost_calls"] = len(lost)
            log.warning(
                "recovery: %d model call(s) were in flight when the node stopped; "
                "each is counted at the worst case it reserved",
                len(lost),
            )
        self.restart_intensity()
        # Held-back work is listed at start-up; results filed on sessions and
        # usage records are read when asked for (a record that does not decode
        # then answers ``corrupt_record``, and ``store verify`` names it).
        self.check("wedged", WedgedRecord)
        self.read_cycles()
        for record in self.live_sessions():
            result = self.decide(record)
            if result is not None and record.info.parent_id is not None:
                self.owe(record.info.parent_id, result, in_outbox=False)
        for item in self.decoded("outbox", OutboxRecord):
            self.owe(item.parent_id, item.result, in_outbox=True)
            self.figures["outbox"] += 1
        for key, raw in self.store.scan("mains"):
            try:
                session_id = decode_id(raw, db="mains", key=key)
                agent_id, _, session_key = key.decode().partition("\x00")
            except (CorruptRecordError, UnicodeDecodeError) as exc:
                why = CorruptRecordError(f"mains entry {key.hex()}: {exc}", db="mains", key=key)
                self.quarantine("mains", why, raw)
                continue
            if session_id in self.back:
                self.plan.mains[(agent_id, session_key)] = session_id
        for message in self.decoded("inbox", InboxRecord):
            if message.session_id in self.plan.dormant:
                self.inbox_message(message)
        if self.batch:
            self.store.write(self.batch)
        self.store.quarantined += self.figures["quarantined"]
        return self.plan


def recover(
    store: Store, agents: dict[str, Agent], now: float, config: NodeConfig | None = None
) -> Recovered:
    """Read ``store`` and durably write the endings recovery decides, before the
    node takes work (``now``: wall-clock seconds). Raises ``StoreError`` if those
    writes fail; an unreadable record is quarantined, never fatal."""
    started = time.perf_counter()
    plan = _Recovery(store, agents, now, config or NodeConfig()).run()
    plan.figures["recovery_ms"] = int((time.perf_counter() - started) * 1000)
    log.info("%s", recovery_summary_line(recovery_summary(plan.figures, plan.held)))
    return plan


def settle_lost_calls(store: Store, lost: list[CallRecord]) -> None:
    """Count the calls a stopped node left in flight (``lost``, read from
    ``calls``) at the worst case each reserved: in its session's own usage
    and in the subtree usage of every session of its chain, in one commit
    that also drops their records. For a node's start-up, before anything
    else writes. A usage record that does not decode is left as it is (the
    start-up quarantines it). The store's error if the write fails
    (nothing counted)."""
    if not lost:
        return
    changed: dict[uuid.UUID, UsageRecord] = {}
    batch = WriteBatch()
    for call in lost:
        for i, session_id in enumerate(call.chain):
            try:
                record = changed.get(session_id) or store.usage(session_id)
            except CorruptRecordError:
                continue
            if record is None:
                record = UsageRecord(session_id=session_id, own=Usage(), subtree=Usage())
            changed[session_id] = UsageRecord(
                session_id=session_id,
                own=record.own + call.ask if i == 0 else record.own,
                subtree=record.subtree + call.ask,
            )
        batch.call_done(call.session_id, call.call_id)
    for record in changed.values():
        batch.usage(record)
    store.write(batch)
