"""A sketch of a kernel written straight on the event loop: a yardstick, not the product.

``bench_peers.py`` runs it beside the node (systems ``sketch/memory`` and
``sketch/store``) to measure what the same supervision costs when an
operation reads as what happens (admit -> record -> start; end -> result to
the parent -> clean up) with no mailbox hop, no ``Reply``, no continuation
closure in between. It keeps the node's semantics for what a tree does:

* spawn rules in order: the parent is live, the depth, the parent's
  children, the node's sessions (a refusal is an ``ErrorInfo``, never a raise);
* compute slots: a child past the limit waits as ``pending``;
* a TTL timer per session with one (``expired``);
* cancellation with a grace, then force (the task is cancelled);
* a crash is a ``failed`` result, a skill that returns is ``completed``;
* one typed ``SessionResult`` per child, delivered to its parent's mailbox
  (a deque; a parent waiting in ``collect`` is woken);
* a parent that ends cancels its live children (grace, then force);
* a Main runs one message cycle per child result it gets, one at a time;
* with a store, the writes the node makes under its persistence rules: a
  Main's record (waited on), a Branch's record (lazy), its end and the
  result owed to the Main (waited on by the ``run`` caller), the Main's
  cycle mark and snapshot (lazy); a worker its running Branch spawned is
  never written.

What it leaves out: events, metrics, budgets, tracing, recording, contexts,
sync skills on threads, suspension, recovery. The node pays for those only
where they are on (the seam's promise), so the sketch's figures are what
the kernel's path alone may cost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    Timings,
    new_session_id,
)
from sessiontree.store import CycleRecord, SessionRecord, Store, WriteBatch

__all__ = ["Cancelled", "Handle", "Kernel"]

Skill = Callable[["Handle"], Awaitable[Any]]


class Cancelled(Exception):  # noqa: N818 - the node's own name for it
    """Raised at a checkpoint of a session asked to stop."""


class Session:
    """One session: its place in the tree, its mailbox of child results, its run."""

    __slots__ = (
        "cancel_code",
        "children",
        "created_at",
        "depth",
        "force",
        "id",
        "kind",
        "live",
        "mailbox",
        "parent",
        "recorded",
        "run",
        "skill",
        "state",
        "task",
        "ttl",
        "waiter",
    )

    def __init__(
        self, kind: SessionKind, parent: Session | None, skill: str, task: str, now: float
    ) -> None:
        self.id = new_session_id()
        self.kind = kind
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.skill = skill
        self.task = task
        self.state = SessionState.PENDING
        self.created_at = now
        self.children: list[Session] = []
        self.live = 0
        self.mailbox: collections.deque[SessionResult] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.run: asyncio.Task[Any] | None = None
        self.ttl: asyncio.TimerHandle | None = None
        self.force: asyncio.TimerHandle | None = None
        self.cancel_code: ErrorCode | None = None
        self.recorded = False


class Handle:
    """What a skill holds: its task, spawns, collect, fan-out, a checkpoint."""

    __slots__ = ("kernel", "session")

    def __init__(self, kernel: Kernel, session: Session) -> None:
        self.kernel, self.session = kernel, session

    @property
    def task(self) -> str:
        return self.session.task

    def checkpoint(self) -> None:
        if self.session.cancel_code is not None:
            raise Cancelled(self.session.cancel_code.value)

    async def spawn_many(self, kind: SessionKind, skill: str, tasks: Iterable[str]) -> list[Any]:
        self.checkpoint()
        return [self.kernel.spawn(self.session, kind, skill, task) for task in tasks]

    async def collect(self) -> list[SessionResult]:
        """Every result of the children spawned so far, once they all ended."""
        session = self.session
        while session.live:
            self.checkpoint()
            session.waiter = asyncio.get_running_loop().create_future()
            await session.waiter
        got = list(session.mailbox)
        session.mailbox.clear()
        return got

    async def fan_out(self, tasks: Iterable[str], skill: str) -> list[SessionResult]:
        await self.spawn_many(SessionKind.WORKER, skill, tasks)
        return await self.collect()


class Kernel:
    """The tree of one node, owned on the loop it runs on."""

    def __init__(
        self,
        skills: dict[str, Skill],
        main_skill: str,
        *,
        store: Store | None = None,
        max_depth: int = 8,
        max_children: int = 1000,
        max_sessions: int = 100_000,
        slots: int = 10_000,
        grace: float = 30.0,
    ) -> None:
        self.skills, self.main_skill, self.store = skills, main_skill, store
        self.max_depth, self.max_children, self.max_sessions = max_depth, max_children, max_sessions
        self.free_slots, self.grace = slots, grace
        self.pending: collections.deque[Session] = collections.deque()
        self.sessions: dict[uuid.UUID, Session] = {}
        self.live = 0
        self.loop = asyncio.get_running_loop()
        self.cycling: dict[uuid.UUID, asyncio.Task[None]] = {}
        self.waiting: dict[uuid.UUID, asyncio.Future[SessionResult]] = {}

    # -- the operations -----------------------------------------------------------

    async def main(self, key: str) -> Session:
        """A Main for ``key``: its record durable before it is answered."""
        main = Session(SessionKind.MAIN, None, self.main_skill, key, time.time())
        main.state = SessionState.ACTIVE
        self.sessions[main.id] = main
        self.live += 1
        if self.store is not None:
            main.recorded = True
            await asyncio.wrap_future(self.store.submit(self._record(main)))
        return main

    async def run(self, parent: Session, kind: SessionKind, skill: str, task: str) -> SessionResult:
        """Spawn a child from outside the tree and wait for its result (durable)."""
        child = self.spawn(parent, kind, skill, task)
        if isinstance(child, ErrorInfo):
            raise RuntimeError(child.message)
        waiter = self.waiting[child.id] = self.loop.create_future()
        return await waiter

    def spawn(
        self, parent: Session, kind: SessionKind, skill: str, task: str, ttl: float | None = None
    ) -> Session | ErrorInfo:
        """Admit (the rules in order), record (lazily) and start a child."""
        if parent.state.is_terminal or parent.cancel_code is not None:
            return ErrorInfo(code=ErrorCode.PARENT_NOT_ACTIVE, message="the parent is ending")
        if parent.depth + 1 > self.max_depth:
            return ErrorInfo(code=ErrorCode.DEPTH_EXCEEDED, message="too deep")
        if parent.live >= self.max_children:
            return ErrorInfo(code=ErrorCode.CHILDREN_EXCEEDED, message="too many children")
        if self.live >= self.max_sessions:
            return ErrorInfo(code=ErrorCode.CAPACITY_EXCEEDED, message="the node is full")
        if skill not in self.skills:
            return ErrorInfo(code=ErrorCode.UNKNOWN_SKILL, message=f"no skill {skill!r}")
        child = Session(kind, parent, skill, task, time.time())
        self.sessions[child.id] = child
        self.live += 1
        parent.children.append(child)
        parent.live += 1
        if self.store is not None and not (
            kind is SessionKind.WORKER and parent.kind is SessionKind.BRANCH
        ):
            child.recorded = True
            self.store.submit(self._record(child), lazy=True)
        if ttl is not None:
            child.ttl = self.loop.call_later(ttl, self.cancel, child, ErrorCode.TTL_EXPIRED)
        self._want_slot(child)
        return child

    def cancel(self, session: Session, code: ErrorCode = ErrorCode.CANCELLED) -> None:
        """Ask ``session`` to stop at its next checkpoint; forced after the grace."""
        if session.state.is_terminal or session.cancel_code is not None:
            return
        session.cancel_code = code
        if session.run is None:  # pending: it ends now
            self._end(session, SessionState.CANCELLED, error=_error(code))
            return
        if session.waiter is not None and not session.waiter.done():
            session.waiter.set_result(None)  # a waiting collect sees it
        session.force = self.loop.call_later(self.grace, session.run.cancel)

    # -- inside -------------------------------------------------------------------

    def _want_slot(self, session: Session) -> None:
        if self.free_slots:
            self.free_slots -= 1
            session.state = SessionState.ACTIVE
            session.run = self.loop.create_task(self._drive(session))
        else:
            self.pending.append(session)

    async def _drive(self, session: Session) -> None:
        skill = self.skills[session.skill]
        try:
            out = await skill(Handle(self, session))
        except (Cancelled, asyncio.CancelledError):
            self._end(session, SessionState.CANCELLED, error=_error(session.cancel_code))
        except Exception as exc:  # noqa: BLE001 - a crash is the session's failed result
            error = ErrorInfo(code=ErrorCode.CRASHED, message=repr(exc))
            self._end(session, SessionState.FAILED, error=error)
        else:
            self._end(session, SessionState.COMPLETED, summary="" if out is None else str(out))

    def _end(
        self,
        session: Session,
        state: SessionState,
        *,
        summary: str = "",
        error: ErrorInfo | None = None,
    ) -> None:
        """End -> result to the parent -> clean up."""
        now = time.time()
        if session.run is not None:
            self.free_slots += 1
            if self.pending:
                self._want_slot(self.pending.popleft())
        session.state = state
        self.live -= 1
        for timer in (session.ttl, session.force):
            if timer is not None:
                timer.cancel()
        parent = session.parent
        result = SessionResult(
            session_id=session.id,
            status=state,
            parent_id=None if parent is None else parent.id,
            kind=session.kind,
            summary=summary,
            error=error,
            timings=Timings(created_at=session.created_at, ended_at=now),
        )
        waiter = self.waiting.pop(session.id, None)
        written = None
        if session.recorded and self.store is not None and parent is not None:
            batch = self._record(session, result).owe(parent.id, result)
            written = self.store.submit(batch, lazy=waiter is None)
        for child in session.children:
            if not child.state.is_terminal:
                self.cancel(child, ErrorCode.PARENT_TERMINATED)
        session.children = []
        del self.sessions[session.id]
        if waiter is not None:
            if written is None:
                waiter.set_result(result)
            else:
                written.add_done_callback(
                    lambda _: self.loop.call_soon_threadsafe(waiter.set_result, result)
                )
        if parent is None:
            return
        parent.live -= 1
        parent.mailbox.append(result)
        if parent.kind is SessionKind.MAIN:
            if parent.id not in self.cycling:
                self.cycling[parent.id] = self.loop.create_task(self._cycles(parent))
        elif parent.waiter is not None and not parent.waiter.done() and not parent.live:
            parent.waiter.set_result(None)

    async def _cycles(self, main: Session) -> None:
        """A Main's message cycles, one per result in its mailbox, in order."""
        skill = self.skills[main.skill]
        try:
            while main.mailbox:
                result = main.mailbox.popleft()
                if self.store is not None:
                    mark = CycleRecord(session_id=main.id, child_id=result.session_id, attempt=1)
                    self.store.submit(WriteBatch().cycle(mark), lazy=True)
                with contextlib.suppress(Exception):  # a failed cycle: the Main goes on
                    await skill(Handle(self, main))
                if self.store is not None:
                    snapshot = self._record(main).cycle_done(main.id)
                    snapshot.file(main.id, result).receipt(result.session_id)
                    self.store.submit(snapshot, lazy=True)
        finally:
            del self.cycling[main.id]

    def _record(self, session: Session, result: SessionResult | None = None) -> WriteBatch:
        parent = session.parent
        info = SessionInfo(
            session_id=session.id,
            agent_id="sketch",
            parent_id=None if parent is None else parent.id,
            kind=session.kind,
            state=session.state,
            depth=session.depth,
            created_at=session.created_at,
            ttl=None,
            deadline=None,
            task="" if session.kind is SessionKind.WORKER else session.task,
            skill=session.skill,
        )
        batch = WriteBatch().session(SessionRecord(info=info, result=result))
        if parent is not None and result is None:
            batch.link(parent.id, session.id)
        return batch


def _error(code: ErrorCode | None) -> ErrorInfo:
    code = code or ErrorCode.CANCELLED
    return ErrorInfo(code=code, message=f"ended: {code.value}")
