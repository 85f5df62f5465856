"""The periodic check: idle Mains passivated, stuck skills flagged, Main
cycles the store refused retried (``_store_held``), memory pressure relieved
and, once memory is free again, branches it suspended resumed.

Its cost is bounded, not a walk of every session each time (a tenth of a
second at 100,000 sessions): it walks the resident Mains, at most
``SWEEP_SLICE`` sessions for the stuck check (a node holding more is swept
over several checks), and the branches only when the probe says memory is
short. A probe that raises is logged and read as no reading.

Memory (see ``_pressure``): at or past the high mark one branch is asked to
suspend per check (suspension is cooperative: memory comes back as branches
park, so the next check reads again before asking another); below the low
mark at most ``RESUME_PER_CHECK`` branches that pressure suspended resume,
the oldest-created first (the nearest its TTL, which counts on while it is
suspended); between the marks nothing changes. One check does one or the
other, never both.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import uuid

from sessiontree.actors import TimerHandle
from sessiontree.actors.runtime import Passivate, post
from sessiontree.protocol import SessionState
from sessiontree.store import SessionRecord
from sessiontree.supervision._entry import TreeEntry, unsettled, with_state
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._pressure import MemoryWatch, Step, step
from sessiontree.supervision._reports import Idle, Tick
from sessiontree.supervision._store_held import StoreHeld
from sessiontree.supervision._suspension import Suspension
from sessiontree.supervision._tree import Tree

__all__ = ["Periodic", "passivable"]

log = logging.getLogger("sessiontree.cortex")

SWEEP_SLICE = 10_000  # sessions the periodic check looks at for being stuck
RESUME_PER_CHECK = 1  # branches memory pressure suspended that one check resumes


class Periodic:
    """The periodic check and passivation (Cortex thread)."""

    def __init__(self, tree: Tree, suspension: Suspension, store_held: StoreHeld) -> None:
        self.tree = tree
        self.suspension = suspension
        self.store_held = store_held
        self.timer: TimerHandle | None = None
        self.sweep: list[TreeEntry] = []  # sessions the stuck check has yet to look at this round
        self.memory = MemoryWatch(tree.rt.config)

    def arm(self) -> None:
        """Ask for the next check in ``check_interval`` seconds. The memory probe
        is read when the timer fires, on the clock's thread: reading a cgroup's
        files took about a millisecond, and on the Cortex's turn (the node's
        event loop) that was a millisecond of every async skill's latency."""
        ref = self.tree.ref
        if ref is None:
            return
        activity, memory = self.tree.rt.activity, self.memory

        def fire() -> None:
            post(ref, Tick(memory.read()), activity)

        self.timer = self.tree.rt.clock.call_later(self.tree.rt.config.check_interval, fire)

    def disarm(self) -> None:
        """Cancel the next check, if one is armed."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def tick(self, used: float | None) -> None:
        """One check (see the module docstring) with the memory probe's reading
        ``used``; the next is armed unless closing."""
        tree = self.tree
        config = tree.rt.config
        now = tree.rt.clock.monotonic()
        idle_after = config.passivate_after
        if tree.store is not None and not tree.closing and idle_after is not None:
            self._ask_idle_mains(now, idle_after)
        self._sweep_stuck(now, config.stuck_after)
        self.store_held.tick()
        if not tree.closing:
            self._watch_memory(used)
        if not tree.closing:
            self.arm()

    def _ask_idle_mains(self, now: float, idle_after: float) -> None:
        entries, resident = self.tree.entries, self.tree.resident_mains
        for sid, entry in list(resident.items()):
            if entries.get(sid) is not entry or entry.state.is_terminal:
                del resident[sid]  # passivated or ended since
            elif entry.state is SessionState.ACTIVE and now - entry.idle_since >= idle_after:
                self._ask_idle(entry)

    def _sweep_stuck(self, now: float, stuck_after: float) -> None:
        tree = self.tree
        sweep = self.sweep
        if not sweep:
            sweep = self.sweep = list(tree.entries.values())
        for _ in range(min(len(sweep), SWEEP_SLICE)):
            entry = sweep.pop()
            core = entry.core
            if (
                core.skill_running
                and not core.blocked
                and not core.stuck
                and core.state is SessionState.ACTIVE
                and core.remote is None  # its worker's liveness is the backend's to watch
                and now - core.last_checkpoint >= stuck_after
            ):
                core.stuck = True
                tree.rt.counters["stuck_flagged"] += 1
                tree.emit(
                    EventKind.STUCK, entry, data={"since_checkpoint_s": now - core.last_checkpoint}
                )

    def _watch_memory(self, used: float | None) -> None:
        """Suspend a branch when the reading ``used`` is past the high mark,
        resume pressure-suspended ones below the low mark (see the module
        docstring)."""
        memory = self.memory
        if memory.probe is None:
            return
        self.tree.rt.memory_used = math.nan if used is None else used
        match step(used, memory.high, memory.low):
            case Step.SUSPEND:
                self.suspension.suspend_for_pressure({"used": used, "high": memory.high})
            case Step.RESUME:
                data = {"used": used, "low": memory.low}
                self.suspension.resume_after_pressure(RESUME_PER_CHECK, data)
            case Step.HOLD:
                pass

    # -- passivation ------------------------------------------------------------------

    def _ask_idle(self, entry: TreeEntry) -> None:
        """Ask a long-idle Main's actor whether it holds anything (its answer is
        an ``Idle``): only the actor knows what it has queued."""
        if entry.passivating is not None or not passivable(entry):
            return
        ref, activity, sid = self.tree.ref, self.tree.rt.activity, entry.session_id
        assert ref is not None

        def done(mark: int | None) -> None:
            post(ref, Idle(sid, mark), activity)

        entry.passivating = entry.mark
        self.tree.post(entry, Passivate(entry.mark, done))

    def idle(self, session_id: uuid.UUID, mark: int | None) -> None:
        """Passivate the Main if nothing reached it since it said it was idle: its
        record is durable (written after its last cycle), so its actor stops and
        the index keeps only what lists it; its next message brings it back."""
        tree = self.tree
        entry = tree.entries.get(session_id)
        if entry is None:
            return
        entry.passivating = None
        if mark is None or mark != entry.mark or tree.closing or not passivable(entry):
            return
        written = entry.snapshot_write
        if written is not None and not written.done():
            # Its record (and the results it files) must be durable before the
            # store is what answers for it: ask again once the write is done.
            ref, activity = tree.ref, tree.rt.activity
            assert ref is not None
            activity.begin()

            def again(_: concurrent.futures.Future[None]) -> None:
                post(ref, Idle(session_id, mark), activity)
                activity.end()

            entry.passivating = mark
            written.add_done_callback(again)
            tree.persist.hurry()  # queued lazily: it is waited on now
            return
        tree.stop_actor(entry)
        del tree.entries[session_id]
        tree.live -= 1
        tree.dormant[session_id] = SessionRecord(info=with_state(entry))
        tree.next_seqs[session_id] = entry.next_seq
        if entry.ledger is not None:
            tree.ledgers_at_rest[session_id] = entry.ledger
        tree.rt.counters["passivated"] += 1
        tree.emit(EventKind.PASSIVATED, entry)


def passivable(entry: TreeEntry) -> bool:
    """Whether a Main may be written out and its actor stopped: active, idle,
    nothing owed to it or in flight (a model call below it included), its
    creation durable."""
    core = entry.core
    return (
        entry.state is SessionState.ACTIVE
        and entry.ref is not None
        and entry.cancel_code is None
        and not core.fenced
        and not core.skill_running
        and entry.live_children == 0
        and entry.inflight == 0
        and entry.persisted
        and not entry.waiters
        and not entry.receipts
        and not entry.unconsumed
        and not unsettled(entry)  # a call below it still to settle into its ledger
    )
