"""Starting runs: a compute slot, the active state, the skill's run; and the
sessions recovery brings back after a restart."""

from __future__ import annotations

import uuid

from sessiontree.actors.runtime import Deliver, Inbound, post, start_run
from sessiontree.protocol import SessionKind, SessionState
from sessiontree.supervision._entry import Sent, TreeEntry
from sessiontree.supervision._recovery import Recovered
from sessiontree.supervision._reports import Granted
from sessiontree.supervision._tree import Tree

__all__ = ["Starting"]


class Starting:
    """Gives sessions their compute slot and starts their runs (Cortex thread)."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree

    def want_slot(self, entry: TreeEntry) -> None:
        """Start ``entry`` once a compute slot is free (now, in the common case)."""
        slots = self.tree.rt.slots
        if slots.try_acquire():  # the common case: no callback made for it
            self.activate(entry)
            return
        ref, activity, sid = self.tree.ref, self.tree.rt.activity, entry.session_id
        assert ref is not None

        def granted() -> None:
            post(ref, Granted(sid), activity)

        if slots.acquire_or_queue(granted):
            self.activate(entry)
        else:
            entry.grant = granted

    def granted(self, session_id: uuid.UUID) -> None:
        """A queued slot came free for ``session_id``; given back if it no longer wants one."""
        tree = self.tree
        entry = tree.entries.get(session_id)
        wanted = entry is not None and (entry.state is SessionState.PENDING or entry.rerun)
        if entry is None or not wanted or entry.state.is_terminal or tree.closing:
            tree.rt.slots.release()  # it ended while it queued, or the node is closing
            if entry is not None:
                entry.grant = None
            return
        entry.grant = None
        self.activate(entry)

    def activate(self, entry: TreeEntry) -> None:
        tree = self.tree
        entry.rerun = False
        entry.started_at = now = tree.now()
        tree.set_state(entry, SessionState.ACTIVE, at=now, taking_slot=True)
        if not entry.core.fenced:
            rt = tree.rt
            start_run(entry.core, rt.host, entry.skill, entry.is_async, rt.executor, rt.loop)

    def rerun(self, entry: TreeEntry) -> None:
        """Run a restored Branch's skill again (it waits for a slot like a spawn)."""
        entry.suspend_requested = False
        self.want_slot(entry)

    def bring_back(self, plan: Recovered) -> list[TreeEntry]:
        """Apply recovery's plan: dormant Mains, suspended branches (those a
        shutdown parked run again), results owed to them, the Mains'
        acknowledged inbound messages, each as the attempt recovery counted.
        With replay held (``plan.held``) nothing runs again until
        ``release_replay``. Returns the branches memory pressure had suspended
        (to resume once memory is free). A raise here fails the node loudly."""
        tree = self.tree
        tree.dormant = plan.dormant
        tree.mains.update(plan.mains)
        held = tree.held
        if plan.held is not None:
            tree.held_reason = plan.held
        rerun, pressured = [], []
        for record in plan.suspended:
            entry = tree.restore(record)  # recovery brought its parent back first
            if record.resume:
                # recovery counted this run already, unless replay is held (then it
                # is counted when released, in memory: the rerun after a release)
                held_back = plan.held is not None
                entry.core.attempt = record.attempts + 1 if held_back else max(1, record.attempts)
                rerun.append(entry)
            elif record.pressured:
                pressured.append(entry)
        # A cycle a crash cut off (attempt > 1; at most one a Main) runs again
        # first: until its rerun marks itself, the Main's one cycle mark holds its
        # count, and any other cycle's snapshot would drop it. A cut-off message
        # is the oldest in its Main's inbox (cycles consume them in order), so
        # running it first keeps the messages in order.
        cut_off: list[tuple[uuid.UUID, Inbound | Deliver]] = []
        rest: list[tuple[uuid.UUID, Inbound | Deliver]] = []
        for parent_id, results in plan.deliveries.items():
            parent = tree.entry(parent_id)
            if parent is None:
                continue
            for result in results:
                parent.core.add_result(result)
                parent.receipts.append(result)
                if parent.kind is SessionKind.MAIN:
                    attempt = plan.attempts.get(result.session_id, 1)
                    span = plan.cut_off.get(result.session_id)
                    deliver = Deliver(result, attempt, cut_off=span)
                    (cut_off if attempt > 1 else rest).append((parent_id, deliver))
        for session_id, messages in plan.inbox.items():
            main = tree.entry(session_id)
            if main is None:
                continue
            for message in messages:
                attempt = plan.attempts.get((session_id, message.seq), 1)
                span = plan.cut_off.get((session_id, message.seq))
                mid = message.id or uuid.uuid5(  # a record from before ids were kept
                    session_id, f"{message.seq}/{message.received_at!r}"
                )
                inbound = Inbound(message.message, message.seq, attempt, cut_off=span, id=mid)
                (cut_off if attempt > 1 else rest).append((session_id, inbound))
                if message.request_id is not None:  # a repeat of it is answered as accepted
                    main.sent = main.sent or {}
                    main.sent[message.request_id] = Sent(mid, done=True)
                main.next_seq = max(main.next_seq, message.seq + 1)
        for main_id, item in cut_off + rest:
            self.replay(main_id, item)
        for entry in rerun:
            if tree.held_reason is not None:
                held.setdefault(entry.session_id, []).append(entry)
            else:
                self.rerun(entry)
        return pressured

    def replay(self, main_id: uuid.UUID, item: Inbound | Deliver) -> None:
        """Run a Main's cycle for ``item`` again, or hold it while replay is held."""
        tree = self.tree
        if tree.held_reason is not None:
            tree.held.setdefault(main_id, []).append(item)
            return
        main = tree.entry(main_id)
        if main is not None:
            tree.post(main, item)

    def release_replay(self) -> int:
        """Run what a held replay kept back, in the order it was kept; how many
        pieces of work that was (0 when replay was not held)."""
        tree = self.tree
        held, tree.held, tree.held_reason = tree.held, {}, None
        released = 0
        for session_id, items in held.items():
            for item in items:
                released += 1
                if isinstance(item, TreeEntry):
                    if not item.state.is_terminal:
                        self.rerun(item)
                    continue
                main = tree.entry(session_id)
                if main is not None and not main.state.is_terminal:
                    tree.post(main, item)
        return released
