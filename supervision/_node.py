"""The embedded facade: ``Node``.

A ``Node`` owns one Cortex, the step executor, the event loop for async
skills and a clock. It is one async core with a sync face: each operation
is written once, as an awaitable (``a``-prefixed, run on the node's event
loop), and the blocking method of the same name is derived from it
(``_faces.blocking``, run on the calling thread), so asyncio applications
embed it without threads of their own and other threads call it as plain
methods. Predictable failures
come back as values (``Spawned.error``, ``SessionResult.error``,
``ErrorInfo``); exceptions are for programming errors and a closed node.

``NodeCore`` (``_node_core``), its one base class, holds the line to the
Cortex, the operations on one session and the lifecycle; ``Node`` adds the
node-wide reads, the input from outside, the upkeep, and the groups that
hold the rest of its surface: ``node.patterns`` (``_node_patterns``),
``node.recovery`` (``_node_recovery``), ``node.recordings``
(``_node_replay``) and ``node.slots`` (``_node_slots``). Where the rest
lives: the refs (``SessionRef``, ``Spawned``) and what a session id may be
(``as_session_id``) in ``_refs``; what the node is built of, and the steps
of its start and of the end of its shutdown, in ``_assembly``; routing
inbound chat in ``_routing``; the host its sessions call in ``_host``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Self

import pykka

from sessiontree.actors import Clock
from sessiontree.actors.runtime import Activity, Inspect, SessionCore, refuse_blocking
from sessiontree.conversations import Conversation
from sessiontree.protocol import (
    ControlMessage,
    NodeClosedError,
    Recording,
    RejectedInputError,
    ReplayReport,
    Routed,
    SessionInfo,
    SessionKind,
    SessionState,
    StoreError,
    UnknownSessionError,
    decode_control,
)
from sessiontree.store import Store
from sessiontree.supervision._assembly import NodeParts, agents_by_id, start_cortex
from sessiontree.supervision._config import Agent, NodeConfig
from sessiontree.supervision._events import Event, EventBus
from sessiontree.supervision._exits import Interrupted, shut_down_at_exit
from sessiontree.supervision._faces import blocking, offloaded, run_blocking
from sessiontree.supervision._gc import tune_gc
from sessiontree.supervision._host import NodeHost
from sessiontree.supervision._memory import MemorySpace
from sessiontree.supervision._model_calls import ModelCalls
from sessiontree.supervision._models import Models
from sessiontree.supervision._node_core import NodeCore
from sessiontree.supervision._node_patterns import Patterns
from sessiontree.supervision._node_recovery import Recovery
from sessiontree.supervision._node_replay import Recordings
from sessiontree.supervision._node_slots import Slots
from sessiontree.supervision._refs import (
    SessionIdLike,
    SessionRef,
    as_session_id,
)
from sessiontree.supervision._replay import replay_recording
from sessiontree.supervision._requests import (
    BringBack,
    Call,
    Control,
    GetActorRef,
    GetStats,
    GetTree,
    ListSessions,
    ListStuck,
    ProbeParked,
)
from sessiontree.supervision._retry import Restarts
from sessiontree.supervision._routing import route_inbound

__all__ = ["Node"]


#: How often ``wait_idle`` asks the store to commit what is queued lazily while
#: it waits (real seconds).
_HURRY_EVERY = 0.05


class Node(NodeCore):
    """One supervision node, embedded: agents, a Cortex, and the sessions it owns.

    Use it as a context manager (``with Node(agents) as node:``) or call
    ``shutdown()``; a node still open when the interpreter exits is shut down
    then, as a clean stop (see ``_exits``: Ctrl-C and the exit). Methods
    raise ``NodeClosedError`` once the node is shut down or has failed
    (reads of sessions and results keep answering while a shutdown runs);
    ``AskTimeoutError`` if the Cortex does not answer within
    ``config.ask_timeout``.

    A method that takes a session id takes a ``uuid.UUID``, its canonical
    string (``str(uuid)``, as read back from JSON or the CLI) or a
    ``SessionRef``; anything else raises ``RejectedInputError`` naming the
    argument before the Cortex is asked anything. An id the node does not
    hold raises ``UnknownSessionError`` (a spawn under one comes back as
    ``Spawned.error`` with ``unknown_session``); one of a slot the node's
    store released to another node raises ``SlotMovedError`` naming that
    node, and new input into a slot being moved ``SlotFrozenError``
    (``node.slots``).

    ``store``: a ``Store`` (the caller closes it) or a directory (the node
    opens and closes it). With one, sessions are durable: recovery runs in
    the constructor (see ``recovery.figures``; ``StoreLockedError`` if another node
    holds the directory), and a spawn, a new Main, an accepted message, a
    memory write and a result reach their caller only once written. Without
    one, everything lives in memory. ``ValueError`` for an agent registered
    twice; a start that fails (recovery's writes, the configured backend)
    releases what it had taken and raises.

    ``loop``: an asyncio loop running on another thread that the node adopts
    instead of starting a loop thread of its own (``Node.astart`` passes the
    caller's; ``ValueError`` when called on that loop's own thread).
    """

    def __init__(
        self,
        agents: Iterable[Agent] = (),
        config: NodeConfig | None = None,
        *,
        clock: Clock | None = None,
        memory: MemorySpace | None = None,
        store: Store | str | os.PathLike[str] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config or NodeConfig()
        agents_of = agents_by_id(agents)
        models = Models(self.config.providers, agents_of.values())  # reads key files: first
        parts = self._parts = NodeParts(
            self.config, clock=clock, memory=memory, store=store, loop=loop
        )
        self.clock: Clock = parts.clock
        self.store: Store | None = parts.store
        self.memory: MemorySpace = parts.memory
        self.conversations = parts.conversations
        """Every session's conversation tree (in the store when the node has one)."""
        self.backends = parts.backends
        """Where skills run besides this process: ``process`` and ``ray`` pools."""
        self.activity = Activity()
        self._restarts = Restarts()  # restarts per parent, for the patterns' intensity limit
        self.events = EventBus()
        if parts.spans is not None:
            self.events.subscribe(parts.spans)
        self._init_lifecycle()  # open; final_sessions, failure, fatal_error, rejected_input
        recovered = parts.recover(agents_of)
        self.recovery = Recovery(self, recovered)
        """What recovery found and held back, and the operator's handles on it."""
        self.recordings = Recordings(self)
        """The recordings of runs spawned with ``record=True``, and their replay."""
        self.patterns = Patterns(self)
        """The coordination patterns, run for a parent session from outside the tree."""
        self.slots = Slots(self, self.events)
        """Moving one slot's trees to another node: freeze, export, release."""
        parts.start_backend()
        self._runtime = parts.runtime(
            agents=agents_of,
            activity=self.activity,
            events=self.events,
            host=NodeHost(self),
            on_fatal=self._on_fatal,
            on_failed=self._on_failed,
            recovered=recovered,
            models=models,
        )
        self._model_calls = ModelCalls(
            models,
            agents_of,
            functools.partial(self._acall, check=False),
            self._tell,
            self.activity,
            lambda: parts.event_loop().loop,
            durable=self.store is not None,
            clock=None if self.config.tracing is None else parts.clock.time,
            capture_content=self.config.tracing is not None and self.config.tracing.capture_content,
        )
        try:
            self._cortex = start_cortex(self._runtime)
        except BaseException:
            parts.abort()
            raise
        if recovered is not None:  # sessions it starts report through self._cortex
            self._tell(Call(BringBack()))
        parts.start_housekeeping()
        shut_down_at_exit(id(self), self._shut_down_at_exit)
        if self.config.gc_tuning:  # last: nothing after it can fail Node()
            tune_gc()

    @classmethod
    async def astart(
        cls,
        agents: Iterable[Agent] = (),
        config: NodeConfig | None = None,
        *,
        clock: Clock | None = None,
        memory: MemorySpace | None = None,
        store: Store | str | os.PathLike[str] | None = None,
    ) -> Self:
        """Start a node on the caller's own event loop: its Cortex, its Mains'
        actors and its async skills run on this loop, between the
        application's own tasks, so an async application's call to the node
        never crosses a thread (a node of its own runs them on a
        ``sessiontree-loop`` thread). The start itself (recovery, the store's
        open) runs on a worker thread while the loop goes on.

        On this loop's thread blocking ``Node`` calls then raise
        ``DeadlockError`` (use the awaitable twins), until ``ashutdown``;
        shut the node down before the loop ends. Raises as ``Node()`` does.
        ``async with await Node.astart(...) as node:`` shuts it down on exit.
        """
        loop = asyncio.get_running_loop()
        start = functools.partial(
            cls, agents, config, clock=clock, memory=memory, store=store, loop=loop
        )
        return await asyncio.to_thread(start)

    @classmethod
    def replay_recording(
        cls, recording: Recording, agents: Iterable[Agent], *, timeout: float = 60.0
    ) -> ReplayReport:
        """``node.recordings.replay`` with ``agents`` instead of a running node's
        (a recording from a file, on another machine: ``sessiontree replay
        --file``). A class method: it starts a node of its own to replay on."""
        return replay_recording(cls, recording, agents, timeout=timeout)

    @property
    def agents(self) -> list[str]:
        """The ids of the agents registered on this node, sorted."""
        return sorted(self._runtime.agents)

    @property
    def skills(self) -> dict[str, list[str]]:
        """Each registered agent's skill names, in the order it registered them,
        by agent id (sorted); its Main's skill is ``Agent.main``."""
        agents = self._runtime.agents
        return {agent_id: list(agents[agent_id].skills) for agent_id in sorted(agents)}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The asyncio loop every async skill of this node runs on (inline ones:
        a ``process`` or ``ray`` step runs in its worker), on the node's one
        thread ``sessiontree-loop``, or the application's own loop for a node
        started with ``astart``; the Cortex and the session actors take their
        messages there too, and it starts with the node; sync skills run on the step
        executor's threads instead. A client that async skills share
        (``httpx.AsyncClient``, ``AsyncOpenAI``) belongs to this loop: use it
        only from skills, and hand it work from other threads with
        ``asyncio.run_coroutine_threadsafe(coro, node.loop)`` (closing it
        before ``shutdown``, for one). Another node, or the application's own
        loop, is another loop. Never block it: every async skill waits then
        (a blocking ``Node`` call made on it raises ``DeadlockError``).
        Raises ``NodeClosedError`` once the node is shut down."""
        self._check_open()
        return self._parts.event_loop().loop

    def ref(self, session_id: SessionIdLike) -> SessionRef:
        """A handle for ``session_id`` (not checked until used; ``RejectedInputError``
        if it is not a session id)."""
        return SessionRef(self, as_session_id(session_id))

    def subscribe(self, observer: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``observer`` for every event (on the Cortex thread); returns an unsubscribe."""
        return self.events.subscribe(observer)

    # -- the node's sessions ----------------------------------------------------------

    async def asessions(
        self, state: SessionState | None = None, kind: SessionKind | None = None
    ) -> list[SessionInfo]:
        """Every session the node holds, optionally filtered by state and kind."""
        return await self._acall(ListSessions(state, kind), check=False)

    sessions = blocking(asessions)

    async def atree(self, root: SessionIdLike) -> dict[str, Any]:
        """The subtree under ``root``: ``{"info", "result", "spending", "children":
        [...]}`` (``spending`` as ``spending()`` gives it); ``UnknownSessionError``
        for an id the node does not hold."""
        return await self._acall(GetTree(self._here(root, "root")), check=False)

    tree = blocking(atree)

    def conversation(self, session_id: SessionIdLike) -> Conversation:
        """A session's conversation tree: a Main's own, or for a spawned session
        the one its context is a branch of (its root Main's).
        ``UnknownSessionError`` for an unknown id."""
        sid = as_session_id(session_id)
        info = self.get(sid)
        return self.conversations.get(info.conversation or sid)

    async def astuck(self) -> list[SessionInfo]:
        """Sessions flagged as stuck."""
        return await self._acall(ListStuck(), check=False)

    stuck = blocking(astuck)

    async def astats(self) -> dict[str, int]:
        """The Cortex's counters and gauges: live sessions, zombies, refusals,
        slots… (``stats`` adds the node's own and its store's)."""
        return await self._acall(GetStats(), check=False)

    # Not astats' blocking face: it adds figures read on the calling thread
    # (the store's, never on the loop), which the awaitable leaves out.
    def stats(self) -> dict[str, int]:
        """Counters and gauges: live sessions, zombies, refusals, slots…"""
        stats = run_blocking(self.astats())
        stats["rejected_input"] = self.rejected_input
        if self.store is not None:
            figures = self.store.stats()
            # the writer's own figures; "store_write_errors" (the Cortex's count of
            # writes it saw refused) stays as the Cortex counted it
            for name in ("commits", "store_full", "quarantined", "long_reads"):
                stats[f"store_{name}"] = int(figures.get(name, 0))
            stats["store_failed_commits"] = int(figures.get("write_errors", 0))
            stats.setdefault("store_write_errors", 0)
        return stats

    # -- input from outside: chat messages and control commands -------------------

    def route(self, inbound: object, agent_id: str | None = None) -> Routed:
        """Route one inbound chat message to its Main, by per-sender session key.

        ``inbound``: an ``Inbound``, a mapping or JSON bytes. The key comes from
        the agent's ``dm_scope`` (``session_key_for``); the Main of (agent, key)
        is got or created (exactly one, also under concurrent first messages);
        the text is appended to its conversation (durable with a store), then
        handed to it as a ``ChatMessage`` mapping (one message cycle). A chat
        command (``/branches``…) is answered in ``Routed.reply`` instead and
        not handed over; a platform message id seen before is not appended
        twice. ``agent_id`` may be omitted when one agent is registered.

        Raises ``RejectedInputError`` naming the field for bad input (counted in
        ``stats()["rejected_input"]``); ``NodeClosedError`` once closed.
        """
        return route_inbound(self, inbound, agent_id)

    def control(self, data: bytes, *, fmt: str = "json") -> object:
        """Decode one untrusted control command and apply it.

        Raises ``RejectedInputError`` (naming the field) for bad input, which
        is counted (``stats()["rejected_input"]``); the node goes on.
        """
        try:
            command: ControlMessage = decode_control(data, fmt=fmt)
        except RejectedInputError:
            self._count_rejected()
            raise
        return self._call(Control(command))

    # -- diagnostics and upkeep ----------------------------------------------------

    def inspect(
        self,
        session_id: SessionIdLike,
        probe: Callable[[SessionCore], Any],
        timeout: float | None = None,
    ) -> Any:
        """Run ``probe(core)`` on the session's actor thread and return its value
        (on the Cortex's for a parked branch, which holds no actor).

        For diagnostics and tests. An exception the probe raises reaches the
        caller and the session keeps running. Raises ``UnknownSessionError``
        when the session has no running actor (it ended, or is a passivated
        Main: a diagnostic never wakes one), ``DeadlockError`` when called
        inside an actor handler, ``pykka.Timeout`` past ``timeout``.
        """
        sid = as_session_id(session_id)
        refuse_blocking()
        ref = self._call(GetActorRef(sid), check=False)
        if ref is None:
            parked, value, error = self._call(ProbeParked(sid, probe), check=False)
            if error is not None:
                raise error
            if parked:
                return value
        if ref is None or not ref.is_alive():
            msg = f"session {sid} has no running actor"
            raise UnknownSessionError(msg, session_id=sid)
        try:  # not counted in activity: a diagnostic read, never work of the tree
            return ref.ask(Inspect(probe), timeout=timeout or self.config.ask_timeout)
        except pykka.ActorDeadError as exc:
            msg = f"session {sid} stopped before answering"
            raise UnknownSessionError(msg, session_id=sid) from exc

    def flush_traces(self, timeout: float | None = None) -> bool:
        """Export the spans that ended so far, now (a traced node; bounded by
        ``timeout`` s, default the export timeout). False if the export could
        not finish or the node is not traced (spans also go out on their
        own, every ``Tracing.schedule_delay``, and at shutdown)."""
        spans = self._parts.spans
        return spans is not None and spans.flush(timeout)

    @property
    def spans_exported(self) -> int:
        """Spans a traced node has exported (0 on a node that is not traced)."""
        spans = self._parts.spans
        return 0 if spans is None else spans.exported()

    @property
    def spans_dropped(self) -> int:
        """Spans a traced node dropped: its export queue was full, or an export
        failed (0 on a node that is not traced)."""
        spans = self._parts.spans
        return 0 if spans is None else spans.dropped()

    def housekeep(self) -> dict[str, Any]:
        """Run the store's housekeeping now: the export to ``config.export_path``
        and the pruning past ``config.prune_after`` (each only when configured).
        Raises ``NodeClosedError`` without a store; ``OSError`` when the export
        cannot be written (then nothing is pruned)."""
        housekeeper = self._parts.housekeeper
        if housekeeper is None:
            msg = "this node has no store to keep"
            raise NodeClosedError(msg)
        return housekeeper.run()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until every mailbox is empty and every skill is blocked at a
        checkpoint, parked or finished; False if ``timeout`` real seconds pass.
        Writes queued lazily are hurried meanwhile, and committed before it
        returns (best effort within ``timeout``: a store holding its commits
        does not make an idle node busy)."""
        deadline = time.monotonic() + timeout
        store = self.store
        while True:
            # a lazy write someone's activity waits on commits now, not at its linger
            if store is not None:
                store.hurry()
            left = deadline - time.monotonic()
            if self.activity.wait_idle(min(_HURRY_EVERY, max(left, 0.0))):
                break
            if left <= 0:
                return False
        self._flush(max(0.0, deadline - time.monotonic()))
        return True

    def _flush(self, timeout: float) -> None:
        """Commit what the node queued lazily, waiting up to ``timeout``: best
        effort (a store that holds its commits, or refuses them, does not make
        an idle node busy; the writer reports its errors)."""
        store = self.store
        if store is not None:
            with contextlib.suppress(StoreError, TimeoutError):
                store.flush(timeout)

    # -- the context managers ---------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Shut the node down. A ``KeyboardInterrupt`` leaving the block goes on
        as ``Interrupted`` (still a ``KeyboardInterrupt``; uncaught, the program
        exits 130 without a traceback)."""
        interrupted = isinstance(exc, KeyboardInterrupt)
        self._shutdown(None, None, "interrupt" if interrupted else None)
        if interrupted and not isinstance(exc, Interrupted):
            raise Interrupted from exc

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ashutdown()

    # -- awaitable faces of blocking operations -------------------------------------

    aroute = offloaded(route)  # it waits for durable writes: run off the event loop
    await_idle = offloaded(wait_idle)
