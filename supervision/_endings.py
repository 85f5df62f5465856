"""Endings: a session becomes terminal, its one result goes to its parent,
then its subtree is cleaned up; the oldest endings are evicted from the index.

The order is the tree's rule (ARCHITECTURE.md, "How a result travels back"):
the state is terminal at once and the result is delivered at once, then the
descendants are cancelled (through ``on_orphans``, which the Cortex wires to
``Cancelling.orphans``).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from sessiontree.actors.runtime import CycleDone, CycleRefused, Deliver, RunEnd
from sessiontree.protocol import (
    TERMINAL_STATES,
    TRANSITIONS,
    ErrorCode,
    ErrorInfo,
    InvalidTransitionError,
    Outcome,
    SessionKind,
    SessionResult,
    SessionState,
    Timings,
)
from sessiontree.supervision._commits import Commits, answer_durable
from sessiontree.supervision._cycle_log import FailedCycles
from sessiontree.supervision._entry import TreeEntry, forget_consumed, id_text, unsettled
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._reports import RunEnded
from sessiontree.supervision._rules import ENDING_MESSAGES, ending_of
from sessiontree.supervision._store_held import StoreHeld
from sessiontree.supervision._tree import Tree

__all__ = ["Endings"]

log = logging.getLogger("sessiontree.cortex")

EVICT_TRIES = 16  # zombies and unsettled endings an eviction passes over at most


class Endings:
    """Ends sessions and delivers their results (Cortex thread)."""

    def __init__(self, tree: Tree, commits: Commits) -> None:
        self.tree = tree
        self.commits = commits
        # What cleans up an ended session's live descendants (not yet asked to
        # cancel): Cancelling.orphans, wired by the Cortex once both exist.
        self.on_orphans: Callable[[TreeEntry], None] = _unwired
        self.failed_cycles = FailedCycles()
        self.store_held = StoreHeld(tree)

    def runs_ended(self, ends: tuple[RunEnded, ...]) -> None:
        """Runs that ended in one pass of the event loop: their writes go into one
        commit, they end at one instant (one clock read), and the retained
        endings are evicted once after them rather than after each (with the
        same budget in all: ``EVICT_TRIES`` an ending). A run whose end ends
        no session (a Main's cycle, a zombie's return) evicts nothing."""
        now = self.tree.now()
        endings = 0
        with self.commits.one_commit():
            for ended in ends:
                endings += self._run_ended(ended.session_id, ended.end, now)
            if endings:
                self.evict(EVICT_TRIES * endings)

    def _run_ended(self, session_id: uuid.UUID, end: RunEnd, now: float) -> bool:
        """One run's end; True if it ended its session."""
        tree = self.tree
        entry = tree.entries.get(session_id)
        if entry is None:
            return False
        if entry.zombie:
            entry.zombie = False
            if entry.kind is SessionKind.MAIN:
                tree.main_zombies -= 1
            else:
                tree.zombies -= 1
        core = entry.core
        tree.run_released(session_id)
        # Ended already, or fenced by a shutdown (a skill it let go, a branch
        # that never parked): the session keeps its state (a branch the shutdown
        # parked resumes after a restart, a Main's message runs again); nothing counts.
        if core.state in TERMINAL_STATES or core.fence_code is not None:
            if end.outcome is not None or end.error is not None:
                tree.rt.counters["refused_after_fence"] += 1
                tree.emit(EventKind.REFUSED, entry, data={"what": "result"})
            return False
        cancel_code = entry.cancel_code
        if cancel_code is None and core.info.kind is SessionKind.MAIN:
            data: dict[str, Any] = {"cycle": end.cycle}
            if end.error:
                data["error"] = end.error.message
            for ext in tree.ext.detail:
                ext.detail(EventKind.CYCLE_ENDED, entry, end.error, data)
            if end.store_refused:
                data["kept"] = True
            tree.emit(
                EventKind.CYCLE_ENDED,
                entry,
                code=end.error.code if end.error else None,
                data=data,
            )
            if end.store_refused:
                self._refused_cycle(entry, end)
                return False
            if end.error is not None:
                tree.rt.counters["main_cycles_failed"] += 1
                self.failed_cycles.failed(id_text(entry), core.info, end.cycle, end.error, now)
            tree.note_input(entry)
            if entry.ledger is not None:
                entry.ledger.new_cycle()
            self._snapshot(entry, now)
            self.store_held.ran(entry)
            if not (tree.closing and tree.store is not None):
                # Closing with a store: no new cycle starts, for one could end after
                # the Cortex stops and then run again after the restart. What is
                # queued stays in the stored inbox and outbox and runs once then.
                # Told once the snapshot is submitted (not while it waits in an open
                # batch): it drops the Main's mark whichever cycle wrote it, so the
                # next cycle's mark must be queued after it, or a crash in that
                # cycle would go uncounted and it would run again as the same attempt.
                self.commits.when_submitted(functools.partial(tree.post, entry, CycleDone()))
            ended = False
        else:
            state, code, outcome, error = ending_of(end, cancel_code)
            if state not in TRANSITIONS[core.state]:
                # A run let go of its checkpoint without its session being made
                # active first (a broken invariant elsewhere): what a skill does
                # never fails the Cortex, so it leaves suspension, then ends.
                log.warning("session %s ended its run while %s", id_text(entry), core.state)
                tree.set_state(entry, SessionState.ACTIVE, at=now)
            self.finish(entry, state, code, outcome, error=error, now=now, evict=False)
            ended = True
        if end.fatal is not None:
            tree.rt.on_fatal(end.fatal)
        return ended

    def _refused_cycle(self, entry: TreeEntry, end: RunEnd) -> None:
        """The store refused a write of a Main's cycle: nothing of it is consumed
        (no snapshot: its message stays in the inbox, a result stays owed), its
        working context is put back as the cycle found it, and its actor keeps
        the input for a retry (``StoreHeld``)."""
        tree = self.tree
        core = entry.core
        cycle_input = core.cycle_input
        if cycle_input is not None and cycle_input.context is not None:
            core.context = cycle_input.context
            cycle_input.context = None
        tree.note_input(entry)
        tree.post(entry, CycleRefused())
        if not tree.closing:
            self.store_held.refused(entry, end.error)

    def _snapshot(self, entry: TreeEntry, now: float) -> None:
        """A Main's snapshot after a cycle, consuming its message (and any whose
        snapshot the store refused before: the cycle ran, so it must not run
        again after a restart)."""
        tree = self.tree
        seq = entry.core.input_seq
        consumed = [] if seq is None else [seq]
        if entry.sent:
            cycle_input = entry.core.cycle_input
            forget_consumed(entry, None if cycle_input is None else cycle_input.key)
        if entry.unconsumed:
            consumed += entry.unconsumed
            entry.unconsumed = None
        receipts = list(entry.receipts)  # the snapshot files those it takes
        write = entry.snapshot_write = tree.persist.snapshot(entry, now, consumed=consumed)
        filed = receipts
        if entry.receipts:  # results not taken yet stay (thousands, when cycles lag behind)
            kept = set(map(id, entry.receipts))
            filed = [r for r in receipts if id(r) not in kept]
        if write is not None and (consumed or filed):
            # told only if it failed (a hop to the loop per cycle cost more)
            self.commits.if_refused(write, functools.partial(_unconsumed, entry, consumed, filed))

    def finish(
        self,
        entry: TreeEntry,
        state: SessionState,
        code: ErrorCode | None,
        outcome: Outcome | None,
        *,
        error: ErrorInfo | None = None,
        message: str | None = None,
        now: float | None = None,
        evict: bool = True,
    ) -> None:
        """Make ``entry`` terminal, deliver its one result, then clean up its subtree.

        ``now``: when it ended (default: the clock's now). ``evict``: False when
        the caller evicts retained endings itself, once after a batch of them.
        An illegal transition raises ``InvalidTransitionError`` before anything
        changed (a broken invariant: the handler fails the node).
        """
        tree = self.tree
        if now is None:
            now = tree.now()
        core = entry.core
        if code is not None and error is None:
            reason = entry.cancel_reason
            detail: dict[str, object] = {}
            # a cancel's reason, unless it ended some other way (its TTL) first
            if reason is not None and code in (entry.cancel_code, ErrorCode.TERMINATED_BY_FORCE):
                detail["reason"] = reason
            error = ErrorInfo(
                code=code,
                message=message or ENDING_MESSAGES[code].format(id_text(entry)),
                detail=detail,
            )
        timer = entry.ttl_timer
        if timer is not None:
            timer.cancel()
            entry.ttl_timer = None  # done: the retained record stays small for the GC
        if entry.grant is not None:
            # False: the Granted message is in flight and Starting.granted releases the slot
            tree.rt.slots.forget(entry.grant)
            entry.grant = None
        self._end_state(entry, state, code, now, error)
        tree.live -= 1
        if not entry.is_async:
            self._thread_ended(entry)
        result = self._result_of(entry, state, error, outcome, now)
        entry.result = result
        write = entry.final_write = tree.persist.ended(entry, result, now)
        if write is not None:
            self.commits.count_failures(write)
        if entry.waiters:
            for reply in entry.waiters:
                answer_durable(entry, reply, tree.persist)
            entry.waiters.clear()
        if entry.parent is not None:
            self._deliver(entry, entry.parent, result, now)
        if entry.ref is not None:
            tree.to_stop.append(entry.ref)
            entry.ref = None  # its actor is done: not kept by the retained record
        tree.terminal.append(core.session_id)
        if evict:
            self.evict(EVICT_TRIES)
        # A session that was itself cancelled had its whole subtree marked then
        # (and could spawn nothing since), so there is nothing left to walk.
        if entry.live_children and entry.cancel_code is None:
            self.on_orphans(entry)
        for watch in entry.watchers:  # last: its events so far are on its tape
            watch.ended(result)
        if tree.shutdown_waiters:
            tree.check_shutdown()

    def _result_of(
        self,
        entry: TreeEntry,
        state: SessionState,
        error: ErrorInfo | None,
        outcome: Outcome | None,
        now: float,
    ) -> SessionResult:
        """The one result of ``entry``, ending ``state`` at ``now``."""
        core = entry.core
        info = core.info
        timings = Timings(created_at=info.created_at, started_at=entry.started_at, ended_at=now)
        ledger = entry.ledger
        own = subtree = None
        settled = True
        if ledger is not None:
            own, subtree, settled = ledger.own, ledger.subtree, ledger.settled
        if outcome is None:  # the defaults: no summary, artifacts or memory ids
            result = SessionResult(
                session_id=core.session_id,
                status=state,
                parent_id=info.parent_id,
                kind=info.kind,
                error=error,
                timings=timings,
                usage=own,
                subtree_usage=subtree,
                usage_settled=settled,
            )
        else:
            result = SessionResult(
                session_id=core.session_id,
                status=state,
                parent_id=info.parent_id,
                kind=info.kind,
                summary=outcome.summary,
                artifacts=dict(outcome.artifacts),
                memory_ids=tuple(outcome.memory_ids),
                error=error,
                timings=timings,
                usage=own,
                subtree_usage=subtree,
                usage_settled=settled,
            )
        for ext in self.tree.ext.result:  # what features add (a Branch's context leaf)
            result = ext.result(entry, result)
        return result

    def _thread_ended(self, entry: TreeEntry) -> None:
        """A sync session ended: a Branch's or Worker's step thread is no longer
        counted, and one its skill still runs on is abandoned (a zombie)."""
        tree = self.tree
        main = entry.core.info.kind is SessionKind.MAIN
        if not main:
            tree.sync_threads -= 1
        if entry.core.skill_running:
            entry.zombie = True
            if main:
                tree.main_zombies += 1  # a thread of the Main pool, not the step pool
            else:
                tree.zombies += 1

    def _end_state(
        self,
        entry: TreeEntry,
        state: SessionState,
        code: ErrorCode | None,
        now: float,
        error: ErrorInfo | None,
    ) -> None:
        """``Tree.set_state`` for an ending: ``entry`` becomes ``state`` (terminal)
        and the event says so (with what extensions add, given its
        ``error``); under the same lock its compute slot is given back and,
        unless its skill still runs (a forced task is yet to be cancelled),
        its task dropped. ``InvalidTransitionError`` (nothing changed) if the
        transition is illegal."""
        core = entry.core
        old = core.state
        if state not in TRANSITIONS[old]:  # a broken invariant: the node fails loudly
            msg = f"session {core.session_id}: {old} -> {state} is not a legal transition"
            raise InvalidTransitionError(msg, session_id=core.session_id)
        with core.cond:
            core.state = state
            held, core.holds_slot = core.holds_slot, False
            if not core.skill_running:
                core.task = None
                core.task_loop = None
        if held:
            core.slots.release()
        tree = self.tree
        data: dict[str, Any] | None = None
        if tree.ext.detail:  # what features add (a traced node: what its span needs)
            data = {}
            for ext in tree.ext.detail:
                ext.detail(EventKind.TRANSITION, entry, error, data)
        tree.emit(EventKind.TRANSITION, entry, previous=old, code=code, at=now, data=data)
        if old is SessionState.SUSPENDED:
            # as set_state writes a Branch leaving suspension (the ending's own write follows)
            tree.persist.snapshot(entry, now, resume=entry.shutdown_park)

    def _deliver(
        self, entry: TreeEntry, parent: TreeEntry, result: SessionResult, now: float
    ) -> None:
        """File ``entry``'s result on ``parent`` and say so (a RESULT_DELIVERED event)."""
        tree = self.tree
        parent_core = parent.core
        parent_live = parent_core.state not in TERMINAL_STATES
        for ext in tree.ext.delivered:  # first: a Main's cycle for it appends after it
            ext.delivered(entry, parent, result, parent_live)
        if parent_live and tree.store is not None:
            if entry.recorded:
                parent.receipts.append(result)  # its next snapshot records the receipt
            else:
                parent.unwritten.append(result)  # written only if the parent suspends
        parent.live_children -= 1
        # Filed at once (so results() and a waiting skill see it now); a live
        # Main also gets it in its mailbox, where it starts a message cycle.
        # Closing with a store, it stays owed and runs after the restart (see _run_ended).
        parent_core.add_result(result)
        live_main = parent_live and parent_core.info.kind is SessionKind.MAIN
        if live_main and not (tree.closing and tree.store is not None):
            tree.note_input(parent)
            tree.post(parent, Deliver(result, trace=entry.info.trace, fresh=True))
        if tree.rt.events.observed:
            tree.emit(EventKind.RESULT_DELIVERED, entry, data={"to": id_text(parent)}, at=now)

    def evict(self, tries: int) -> None:
        """Forget the oldest endings past ``retain_terminal`` whose terminal write
        is durable (the store answers for them from then on).

        An ending whose subtree still has a model call in flight stays (its
        usage is still to settle), as a zombie does (its thread may still
        report). Bounded work per ending: those are passed over at most ``tries`` times
        a call (``EVICT_TRIES`` an ending; passing over every one of them each
        time made a cascade of 90,000 sessions quadratic while their writes were
        queued). An ending whose terminal write is not yet durable stops the
        round: writes commit in the order they were made, so the endings after
        it wait for theirs too.
        """
        tree = self.tree
        terminal, entries = tree.terminal, tree.entries
        passed = 0
        durable = None  # a write seen done (a batch's endings share one)
        for _ in range(len(terminal) - tree.rt.config.retain_terminal):
            sid = terminal[0]
            old = entries.get(sid)
            if old is None:
                terminal.popleft()
                continue
            write = old.final_write
            if write is not None and write is not durable:
                if not write.done():
                    return  # the store still holds its old state (reads fall back to it)
                durable = write
            terminal.popleft()
            # its thread may still report, or a call in its subtree settle: a later round
            if old.zombie or unsettled(old):
                terminal.append(sid)
                passed += 1
                if passed >= tries:
                    return
                continue
            del entries[sid]
            parent = old.parent
            if parent is not None:
                parent.children.pop(sid, None)
                if old.info.request_id is not None:
                    parent.requests.pop(old.info.request_id, None)
            old.parent = None
            if old.kind is SessionKind.MAIN:
                key = (old.agent.agent_id, old.info.key or "")
                if tree.mains.get(key) == sid:  # a newer Main may hold the key
                    del tree.mains[key]


def _unwired(entry: TreeEntry) -> None:
    msg = f"session {entry.session_id} ended with live children and no orphan cleanup wired"
    raise AssertionError(msg)


def _unconsumed(
    entry: TreeEntry, consumed: list[int], filed: list[SessionResult], error: BaseException
) -> None:
    """A Main's snapshot was refused: the messages it consumed are consumed, and
    the results it filed are filed, by the next one (they ran; a restart must
    not run them again)."""
    if not entry.state.is_terminal:
        if consumed:
            entry.unconsumed = consumed + (entry.unconsumed or [])
        entry.receipts[:0] = filed
