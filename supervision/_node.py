"""The embedded facade: ``Node``, ``SessionRef`` and ``Spawned``.

A ``Node`` owns one Cortex, the step executor, the event loop for async
skills and a clock. Its blocking methods have awaitable twins (``a``-prefixed)
so asyncio applications embed it without threads of their own. Predictable
failures come back as values (``Spawned.error``, ``SessionResult.error``,
``ErrorInfo``); exceptions are for programming errors and a closed node.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import pykka

from sessiontree.actors import AskTimeoutError, Clock, RealClock
from sessiontree.actors.backends import ProcessBackend, RayBackend
from sessiontree.actors.runtime import (
    Activity,
    Backends,
    ComputeSlots,
    Dispatcher,
    EventLoopThread,
    Inspect,
    Reply,
    RunEnd,
    SessionCore,
    StepExecutor,
    actor_class,
    in_actor_handler,
    post,
    start_actor,
)
from sessiontree.conversations import Conversation, Conversations, MemoryBackend
from sessiontree.protocol import (
    ChatMessage,
    ControlMessage,
    DeadlockError,
    ErrorCode,
    ErrorInfo,
    Gathered,
    NodeClosedError,
    RejectedInputError,
    Routed,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    SessionTreeError,
    SpawnSpec,
    UnknownAgentError,
    UnknownSessionError,
    decode_control,
    decode_inbound,
    make_spec,
    session_key_for,
    spawn_batch,
)
from sessiontree.store import Store
from sessiontree.supervision._chat import chat_command, is_command
from sessiontree.supervision._config import Agent, NodeConfig
from sessiontree.supervision._conversations import StoreConversations
from sessiontree.supervision._cortex import Cortex
from sessiontree.supervision._drivers import (
    NodeDriver,
    drive_async,
    drive_node_async,
    drive_sync,
)
from sessiontree.supervision._entry import SpawnAnswer
from sessiontree.supervision._events import Event, EventBus
from sessiontree.supervision._gc import release_gc, tune_gc
from sessiontree.supervision._housekeeping import Housekeeper
from sessiontree.supervision._memory import InMemorySpace, MemorySpace, StoreMemory
from sessiontree.supervision._persist import Persister
from sessiontree.supervision._recovery import recover
from sessiontree.supervision._reports import (
    ChildUpdate,
    Parked,
    Progress,
    Refused,
    RunEnded,
    RunsEnded,
)
from sessiontree.supervision._requests import (
    AwaitResult,
    BeginShutdown,
    BringBack,
    Call,
    Cancel,
    Control,
    ForceWorkers,
    ForgetWaiter,
    GetActorRef,
    GetInfo,
    GetResult,
    GetResults,
    GetStats,
    GetTree,
    ListSessions,
    ListStuck,
    OpenMain,
    ProbeParked,
    Request,
    Resume,
    Send,
    ShutdownDeadline,
    Spawn,
    SpawnMany,
    StopAll,
    Suspend,
)
from sessiontree.supervision._retry import Restarts
from sessiontree.supervision._runtime import Runtime

__all__ = ["Node", "SessionRef", "Spawned"]

log = logging.getLogger("sessiontree.node")

T = TypeVar("T")

_NIL = uuid.UUID(int=0)


@dataclass(frozen=True)
class Spawned:
    """The answer to a spawn: the new session's ``ref``, or the ``error`` that refused it.

    ``existing`` is True when a repeated ``request_id`` returned the first session.
    """

    ref: SessionRef | None
    error: ErrorInfo | None
    existing: bool = False

    @property
    def ok(self) -> bool:
        """True when a session exists (new or, for a repeated request_id, the first)."""
        return self.ref is not None

    @property
    def session_id(self) -> uuid.UUID | None:
        """The session's id, or None when refused."""
        return self.ref.session_id if self.ref is not None else None


class SessionRef:
    """The outside handle of one session. Blocking methods have ``a``-prefixed twins."""

    __slots__ = ("_node", "session_id")

    def __init__(self, node: Node, session_id: uuid.UUID) -> None:
        self._node = node
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"<SessionRef {self.session_id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionRef) and other.session_id == self.session_id

    def __hash__(self) -> int:
        return hash(self.session_id)

    def info(self) -> SessionInfo:
        """Identity and current state; ``UnknownSessionError`` if the node forgot it."""
        return self._node.get(self.session_id)

    @property
    def state(self) -> SessionState:
        """The current state."""
        return self.info().state

    def wait(self, timeout: float | None = None) -> SessionResult | None:
        """Block until the session ends and return its result; None if ``timeout``
        (real seconds) passes first."""
        return self._node.wait(self.session_id, timeout)

    def result(self) -> SessionResult | None:
        """The result if the session has ended, else None (does not wait)."""
        return self._node.result(self.session_id)

    def results(self) -> list[SessionResult]:
        """The results this session received from its children."""
        return self._node.results(self.session_id)

    def cancel(self) -> ErrorInfo | None:
        """Cancel this session and its subtree; see ``Node.cancel``."""
        return self._node.cancel(self.session_id)

    def suspend(self) -> ErrorInfo | None:
        """Suspend (branches only); see ``Node.suspend``."""
        return self._node.suspend(self.session_id)

    def resume(self) -> ErrorInfo | None:
        """Resume (branches only); see ``Node.resume``."""
        return self._node.resume(self.session_id)

    def send(self, message: Any) -> ErrorInfo | None:
        """Send an inbound message (mains only); see ``Node.send``."""
        return self._node.send(self.session_id, message)

    def spawn(self, spec: SpawnSpec | None = None, /, **fields: Any) -> Spawned:
        """Spawn a child under this session; see ``Node.spawn``."""
        return self._node.spawn(self.session_id, spec, **fields)

    def spawn_many(self, specs: Iterable[SpawnSpec]) -> list[Spawned]:
        """Spawn a batch of children under this session; see ``Node.spawn_many``."""
        return self._node.spawn_many(self.session_id, specs)

    def run(self, spec: SpawnSpec | None = None, /, **fields: Any) -> SessionResult | None:
        """Spawn a fresh child under this session and wait; see ``Node.run``."""
        return self._node.run(self.session_id, spec, **fields)

    async def ainfo(self) -> SessionInfo:
        return await self._node.aget(self.session_id)

    async def await_result(self, timeout: float | None = None) -> SessionResult | None:
        """Awaitable ``wait``."""
        return await self._node.await_result(self.session_id, timeout)

    async def acancel(self) -> ErrorInfo | None:
        return await self._node.acancel(self.session_id)

    async def asuspend(self) -> ErrorInfo | None:
        return await self._node.asuspend(self.session_id)

    async def aresume(self) -> ErrorInfo | None:
        return await self._node.aresume(self.session_id)

    async def asend(self, message: Any) -> ErrorInfo | None:
        return await self._node.asend(self.session_id, message)


class _Host:
    """The ``SessionHost`` a node gives its sessions: everything goes to the Cortex."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._ended: list[RunEnded] = []  # touched on the event loop thread only

    # A skill spawning while the node shuts down (or after) gets node_closed
    # back as a value, like any refused spawn.
    def spawn(self, parent: SessionCore, spec: SpawnSpec) -> Spawned:
        try:
            answer = self.node._call(Spawn(parent.session_id, spec), check=False)
        except NodeClosedError as exc:
            return Spawned(None, exc.to_info())
        return self.node._spawned(answer)

    async def spawn_async(self, parent: SessionCore, spec: SpawnSpec) -> Spawned:
        try:
            answer = await self.node._acall(Spawn(parent.session_id, spec), check=False)
        except NodeClosedError as exc:
            return Spawned(None, exc.to_info())
        return self.node._spawned(answer)

    def spawn_many(self, parent: SessionCore, specs: tuple[SpawnSpec, ...]) -> list[Spawned]:
        try:
            answers = self.node._call(SpawnMany(parent.session_id, specs), check=False)
        except NodeClosedError as exc:
            return [Spawned(None, exc.to_info()) for _ in specs]
        return self.node._all_spawned(answers)

    async def spawn_many_async(
        self, parent: SessionCore, specs: tuple[SpawnSpec, ...]
    ) -> list[Spawned]:
        try:
            answers = await self.node._acall(SpawnMany(parent.session_id, specs), check=False)
        except NodeClosedError as exc:
            return [Spawned(None, exc.to_info()) for _ in specs]
        return self.node._all_spawned(answers)

    def memory_put(self, core: SessionCore, key: str, value: Any) -> str:
        return self.node.memory.put(core.info.agent_id, core.session_id, key, value)

    async def memory_put_async(self, core: SessionCore, key: str, value: Any) -> str:
        return await self.node.memory.aput(core.info.agent_id, core.session_id, key, value)

    def memory_get(self, core: SessionCore, key: str) -> Any:
        return self.node.memory.get(core.info.agent_id, key)

    def progress(self, core: SessionCore, note: str, data: dict[str, Any]) -> None:
        self.node._tell(Progress(core.session_id, note, dict(data)))

    def cancel(self, core: SessionCore, child_id: uuid.UUID) -> ErrorInfo | None:
        self.node._tell(Call(Cancel(child_id)))  # never blocks a skill's loop
        return None

    def send_to_parent(self, core: SessionCore, message: Any) -> None:
        self.node._tell(ChildUpdate(core.session_id, message))

    def run_pattern(self, session: Any, name: str, args: tuple[Any, ...], options: Any) -> Any:
        return drive_sync(session, self.node._restarts, name, args, dict(options))

    async def arun_pattern(
        self, session: Any, name: str, args: tuple[Any, ...], options: Any
    ) -> Any:
        return await drive_async(session, self.node._restarts, name, args, dict(options))

    def conversation(self, core: SessionCore, guard: Callable[[str], None]) -> Conversation:
        writable = core.info.kind is not SessionKind.WORKER
        return self.node.conversations.get(core.session_id, guard=guard, writable=writable)

    def parked(self, core: SessionCore) -> None:
        self.node._tell(Parked(core.session_id))

    def run_ended(self, core: SessionCore, end: RunEnd) -> None:
        loop = self.node._loop
        if loop is None or not loop.is_current():
            self.node._tell(RunEnded(core.session_id, end))
            return
        # Async runs ending in one pass of the loop go to the Cortex as one
        # message: a cancel cascade ends thousands at once, and a thread
        # hand-off per session was most of its cost.
        ended = self._ended
        ended.append(RunEnded(core.session_id, end))
        if len(ended) == 1:
            self.node.activity.begin()  # the batch is counted until it is posted
            loop.loop.call_soon(self._flush_ended)

    def _flush_ended(self) -> None:
        batch, self._ended = self._ended, []
        self.node._tell(RunsEnded(tuple(batch)))
        self.node.activity.end()

    def refused(self, core: SessionCore, what: str) -> None:
        self.node._tell(Refused(core.session_id, what))


class Node:
    """One supervision node, embedded: agents, a Cortex, and the sessions it owns.

    Use it as a context manager (``with Node(agents) as node:``) or call
    ``shutdown()``. Methods raise ``NodeClosedError`` once the node is shut
    down or has failed; ``AskTimeoutError`` if the Cortex does not answer
    within ``config.ask_timeout``.

    ``store``: a ``Store`` (the caller closes it) or a directory (the node
    opens and closes it). With one, sessions are durable: recovery runs in
    the constructor (see ``recovery``; ``StoreLockedError`` if another node
    holds the directory), and a spawn, a new Main, an accepted message, a
    memory write and a result reach their caller only once written. Without
    one, everything lives in memory.
    """

    def __init__(
        self,
        agents: Iterable[Agent] = (),
        config: NodeConfig | None = None,
        *,
        clock: Clock | None = None,
        memory: MemorySpace | None = None,
        store: Store | str | os.PathLike[str] | None = None,
    ) -> None:
        self.config = config or NodeConfig()
        self._own_clock = clock is None
        self.clock: Clock = clock or RealClock()
        self._own_store = store is not None and not isinstance(store, Store)
        self.store: Store | None = (
            store if store is None or isinstance(store, Store) else Store(store)
        )
        if memory is None:
            memory = InMemorySpace() if self.store is None else StoreMemory(self.store, self.clock)
        self.memory: MemorySpace = memory
        # Every session's conversation tree (in the store when the node has one).
        self.conversations = Conversations(
            MemoryBackend() if self.store is None else StoreConversations(self.store), self.clock
        )
        self.activity = Activity()
        self._restarts = Restarts()  # restarts per parent, for the patterns' intensity limit
        self.events = EventBus()
        self.fatal_error: BaseException | None = None
        self.rejected_input = 0
        self.final_sessions: list[SessionInfo] = []
        """Every session as the shutdown left it (filled in by ``shutdown``)."""
        self.failure: BaseException | None = None
        self.recovery: dict[str, int] = {}
        """What recovery found on start (empty without a store): mains, suspended,
        failed, quarantined, terminal, results owed, ``recovery_ms``…"""
        self._state = "open"
        self._forced = False
        self._stopped = threading.Event()
        self._state_lock = threading.Lock()
        self._loop: EventLoopThread | None = None
        self._loop_lock = threading.Lock()
        self._dispatcher = _dispatcher_for(self.config)
        self._executor = StepExecutor(self.config.max_step_threads)
        self._main_executor = StepExecutor(self.config.max_step_threads, "sessiontree-step-main")
        self.backends = _backends_for(self.config)
        """Where skills run besides this process: ``process`` and ``ray`` pools."""
        agents_by_id = _by_id(agents)
        counters: collections.Counter[str] = collections.Counter()
        recovered = None
        if self.store is not None:
            try:
                recovered = recover(self.store, agents_by_id, self.clock.time())
            except BaseException:
                self._abort_start()
                raise
            self.recovery = dict(recovered.figures)
        self._start_own_backend()
        self._runtime = Runtime(
            config=self.config,
            clock=self.clock,
            activity=self.activity,
            slots=ComputeSlots(self.config.max_running_skills),
            executor=self._executor,
            main_executor=self._main_executor,
            loop=self._event_loop,
            events=self.events,
            host=_Host(self),
            agents=agents_by_id,
            on_fatal=self._on_fatal,
            on_failed=self._on_failed,
            persist=Persister(self.store, counters),
            recovered=recovered,
            counters=counters,
            dispatcher=self._dispatcher,
            backends=self.backends,
        )
        # The Cortex decides every change of the tree: a thread of its own, never
        # a turn in the pool its sessions share.
        cortex_class = actor_class(Cortex, "threading")
        self._cortex = start_actor(cortex_class, self._runtime)
        if recovered is not None:  # sessions it starts report through self._cortex
            self._tell(Call(BringBack()))
        self._housekeeper = self._start_housekeeping()
        if self.config.gc_tuning:  # last: nothing after it can fail Node()
            tune_gc()

    # -- plumbing -----------------------------------------------------------------

    def _start_housekeeping(self) -> Housekeeper | None:
        """The store's export and pruning schedule (none without a store)."""
        if self.store is None:
            return None
        housekeeper = Housekeeper(self.store, self.config, self.clock)
        housekeeper.start()
        return housekeeper

    def _start_own_backend(self) -> None:
        """The node's backend starts with it; one that cannot raises out of ``Node()``."""
        if self.config.backend == "inline":
            return
        try:
            self.backends.get(self.config.backend)
        except BaseException:
            self._abort_start()
            raise

    def _abort_start(self) -> None:
        """``Node()`` failed: release what it had taken (the dispatcher's threads,
        started backends, a store it opened)."""
        if self._dispatcher is not None:
            self._dispatcher.close()
        self.backends.close()
        self._close_owned()

    def _event_loop(self) -> EventLoopThread:
        loop = self._loop  # once made, it stays: no lock to read it (a run starts each)
        if loop is not None:
            return loop
        with self._loop_lock:
            if self._loop is None:
                self._loop = EventLoopThread()
            return self._loop

    def _check_open(self) -> None:
        if self.failure is not None:
            msg = f"node failed: {self.failure!r}"
            raise NodeClosedError(msg)
        if self._state != "open":
            msg = f"node is {self._state}"
            raise NodeClosedError(msg)

    def _tell(self, message: object) -> None:
        if not post(self._cortex, message, self.activity):
            log.warning("cortex is gone; dropped %s", type(message).__name__)

    def _send(self, request: Request[Any], reply: Reply) -> None:
        if not post(self._cortex, Call(request, reply), self.activity):
            msg = "the cortex is not running"
            raise NodeClosedError(msg)

    def _call(self, request: Request[T], *, timeout: float | None = None, check: bool = True) -> T:
        """Ask the Cortex ``request`` and wait for its answer (``check``: refuse
        first if the node is closed). Raises what the Cortex failed the request
        with, ``NodeClosedError`` if it is gone, ``AskTimeoutError`` past ``timeout``."""
        if check:
            self._check_open()
        reply = Reply()
        self._send(request, reply)
        answer: T = reply.get(self.config.ask_timeout if timeout is None else timeout)
        return answer

    async def _acall(self, request: Request[T], *, check: bool = True) -> T:
        """Awaitable ``_call``."""
        if check:
            self._check_open()
        reply = Reply()
        self._send(request, reply)
        answer: T = await reply.get_async(self.config.ask_timeout)
        return answer

    def _on_fatal(self, error: BaseException) -> None:
        """A KeyboardInterrupt/SystemExit inside the runtime: shut down in order."""
        if self.fatal_error is not None:
            return
        self.fatal_error = error
        log.critical("%r inside the runtime; shutting the node down", error)
        threading.Thread(target=self.shutdown, name="sessiontree-fatal", daemon=True).start()

    def _on_failed(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
            log.critical("the cortex failed (%r); the node refuses all further work", error)

    @property
    def closed(self) -> bool:
        """True once a shutdown began or the node failed."""
        return self._state != "open" or self.failure is not None

    @property
    def agents(self) -> list[str]:
        """The ids of the agents registered on this node, sorted."""
        return sorted(self._runtime.agents)

    def ref(self, session_id: uuid.UUID) -> SessionRef:
        """A handle for ``session_id`` (not checked until used)."""
        return SessionRef(self, session_id)

    def subscribe(self, observer: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``observer`` for every event (on the Cortex thread); returns an unsubscribe."""
        return self.events.subscribe(observer)

    # -- sessions -----------------------------------------------------------------

    def main(self, agent_id: str, key: str = "internal:main:main") -> SessionRef:
        """The one Main of ``agent_id`` for session ``key`` (created on first use).

        Raises ``RejectedInputError`` for an unknown agent or a malformed key.
        """
        return SessionRef(self, self._call(OpenMain(agent_id, key)))

    def spawn(
        self, parent: uuid.UUID | SessionRef, spec: SpawnSpec | None = None, /, **fields: Any
    ) -> Spawned:
        """Spawn a child of ``parent``; a refused spawn comes back as ``Spawned.error``."""
        return self._spawned(self._call(Spawn(_sid(parent), make_spec(spec, **fields))))

    def spawn_many(
        self, parent: uuid.UUID | SessionRef, specs: Iterable[SpawnSpec]
    ) -> list[Spawned]:
        """Spawn a batch of children of ``parent`` in one turn of the Cortex, their
        records in one commit: one ``Spawned`` per spec, in order. Each spec is
        checked as ``spawn`` checks it (a refused one does not stop the rest);
        ``RejectedInputError`` naming the field for a spec that is not a
        ``SpawnSpec``. The batched path for spawning thousands at once."""
        return self._all_spawned(self._call(SpawnMany(_sid(parent), spawn_batch(specs))))

    def _spawned(self, answer: SpawnAnswer) -> Spawned:
        ref = SessionRef(self, answer.session_id) if answer.session_id else None
        return Spawned(ref, answer.error, answer.existing)

    def _all_spawned(self, answers: list[SpawnAnswer]) -> list[Spawned]:
        return [self._spawned(answer) for answer in answers]

    def run(
        self,
        parent: uuid.UUID | SessionRef,
        spec: SpawnSpec | None = None,
        /,
        timeout: float | None = None,
        **fields: Any,
    ) -> SessionResult | None:
        """Spawn a fresh session and wait for its result (never reuses a session).

        A refused spawn returns a ``failed`` result carrying the refusal's
        error (its ``session_id`` is the nil UUID); None only if ``timeout``
        (real seconds) passes first.
        """
        spawned = self.spawn(parent, make_spec(spec, **fields))
        if spawned.ref is None:
            return _refused(spawned.error)
        return spawned.ref.wait(timeout)

    def get(self, session_id: uuid.UUID | SessionRef) -> SessionInfo:
        """Identity and state; ``UnknownSessionError`` for an id the node does not hold."""
        return self._call(GetInfo(_sid(session_id)), check=False)

    def sessions(
        self, state: SessionState | None = None, kind: SessionKind | None = None
    ) -> list[SessionInfo]:
        """Every session the node holds, optionally filtered by state and kind."""
        return self._call(ListSessions(state, kind), check=False)

    def tree(self, root: uuid.UUID | SessionRef) -> dict[str, Any]:
        """The subtree under ``root``: ``{"info", "result", "children": [...]}``."""
        return self._call(GetTree(_sid(root)), check=False)

    def cancel(self, session_id: uuid.UUID | SessionRef) -> ErrorInfo | None:
        """Cancel a session and its subtree (one deadline: now + grace); None when accepted."""
        return self._call(Cancel(_sid(session_id)))

    def suspend(self, session_id: uuid.UUID | SessionRef) -> ErrorInfo | None:
        """Park a Branch at its next checkpoint; ``invalid_transition`` for other kinds."""
        return self._call(Suspend(_sid(session_id)))

    def resume(self, session_id: uuid.UUID | SessionRef) -> ErrorInfo | None:
        """Resume a suspended Branch."""
        return self._call(Resume(_sid(session_id)))

    def send(self, session_id: uuid.UUID | SessionRef, message: Any) -> ErrorInfo | None:
        """Send a Main an inbound message (one message cycle); an error if it cannot take it."""
        return self._call(Send(_sid(session_id), message))

    def conversation(self, session_id: uuid.UUID | SessionRef) -> Conversation:
        """A session's conversation tree (``UnknownSessionError`` for an unknown id)."""
        sid = _sid(session_id)
        self.get(sid)
        return self.conversations.get(sid)

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
        try:
            message = decode_inbound(inbound)
            agent = self._route_agent(agent_id)
            key = str(session_key_for(message, agent.dm_scope))
        except RejectedInputError:
            with self._state_lock:
                self.rejected_input += 1
            raise
        main = self.main(agent.agent_id, key)
        conversation = self.conversations.get(main.session_id)
        routed = Routed(agent_id=agent.agent_id, key=key, session_id=main.session_id)
        if is_command(message.text):
            reply = chat_command(conversation, message.text, reply_to=message.reply_to)
            return msgspec.structs.replace(routed, reply=reply)
        try:
            if message.message_id is None:
                appended, fresh = conversation.append("user", message.text), True
            else:
                appended, fresh = conversation.append_once(
                    "user", message.text, platform_id=message.message_id
                )
        except RejectedInputError as exc:
            with self._state_lock:
                self.rejected_input += 1
            field = {"content": "text", "platform_id": "message_id"}.get(exc.field or "", exc.field)
            raise RejectedInputError(str(exc), field=field) from None
        if not fresh:  # a gateway's retry: stored and handed over once already
            return msgspec.structs.replace(routed, message_id=appended.id, duplicate=True)
        chat = ChatMessage(key=key, message_id=appended.id, inbound=message)
        error = self.send(main, chat.to_message())
        return msgspec.structs.replace(routed, message_id=appended.id, error=error)

    def _route_agent(self, agent_id: str | None) -> Agent:
        agents = self._runtime.agents
        if agent_id is None:
            if len(agents) != 1:
                msg = f"agent_id is needed: this node has {len(agents)} agents"
                raise RejectedInputError(msg, field="agent_id")
            return next(iter(agents.values()))
        agent = agents.get(agent_id)
        if agent is None:
            msg = f"no agent {agent_id!r} on this node"
            raise UnknownAgentError(msg, field="agent_id")
        return agent

    # -- coordination patterns, for a parent session ---------------------------------

    def fan_out(self, parent: uuid.UUID | SessionRef, tasks: Any, **options: Any) -> Gathered:
        """One child of ``parent`` per task, queued past the children limit; waits
        for them (the node's clock). Options and result: ``supervision.fan_out``."""
        return self._pattern(parent, "fan_out", (list(tasks),), options)

    def pipeline(self, parent: uuid.UUID | SessionRef, stages: Any, **options: Any) -> Gathered:
        """Stages of children of ``parent``, each seeded with the previous results."""
        return self._pattern(parent, "pipeline", (list(stages),), options)

    def map_reduce(
        self,
        parent: uuid.UUID | SessionRef,
        items: Any,
        map_task: Any,
        reduce_task: Any,
        **options: Any,
    ) -> Gathered:
        """Map batches of ``items`` in children of ``parent``, then reduce them."""
        return self._pattern(parent, "map_reduce", (list(items), map_task, reduce_task), options)

    def continue_run(
        self, parent: uuid.UUID | SessionRef, token: str, context: str, **options: Any
    ) -> Gathered:
        """A fresh child of ``parent`` continuing the run a token names, with ``context``."""
        return self._pattern(parent, "continue_run", (token, context), options)

    async def afan_out(
        self, parent: uuid.UUID | SessionRef, tasks: Any, **options: Any
    ) -> Gathered:
        """Awaitable ``fan_out``."""
        return await self._apattern(parent, "fan_out", (list(tasks),), options)

    async def apipeline(
        self, parent: uuid.UUID | SessionRef, stages: Any, **options: Any
    ) -> Gathered:
        """Awaitable ``pipeline``."""
        return await self._apattern(parent, "pipeline", (list(stages),), options)

    async def amap_reduce(
        self,
        parent: uuid.UUID | SessionRef,
        items: Any,
        map_task: Any,
        reduce_task: Any,
        **options: Any,
    ) -> Gathered:
        """Awaitable ``map_reduce``."""
        args = (list(items), map_task, reduce_task)
        return await self._apattern(parent, "map_reduce", args, options)

    async def acontinue_run(
        self, parent: uuid.UUID | SessionRef, token: str, context: str, **options: Any
    ) -> Gathered:
        """Awaitable ``continue_run``."""
        return await self._apattern(parent, "continue_run", (token, context), options)

    async def _apattern(
        self, parent: uuid.UUID | SessionRef, name: str, args: tuple[Any, ...], options: Any
    ) -> Gathered:
        self._check_open()
        return await drive_node_async(self, _sid(parent), self._restarts, name, args, dict(options))

    def _pattern(
        self, parent: uuid.UUID | SessionRef, name: str, args: tuple[Any, ...], options: Any
    ) -> Gathered:
        self._check_open()
        return NodeDriver(self, _sid(parent)).run(self._restarts, name, args, dict(options))

    def control(self, data: bytes, *, fmt: str = "json") -> object:
        """Decode one untrusted control command and apply it.

        Raises ``RejectedInputError`` (naming the field) for bad input, which
        is counted (``stats()["rejected_input"]``); the node goes on.
        """
        try:
            command: ControlMessage = decode_control(data, fmt=fmt)
        except RejectedInputError:
            with self._state_lock:
                self.rejected_input += 1
            raise
        return self._call(Control(command))

    def wait(
        self, session_id: uuid.UUID | SessionRef, timeout: float | None = None
    ) -> SessionResult | None:
        """The session's result once it ends; None if ``timeout`` real seconds pass first."""
        sid = _sid(session_id)
        reply = Reply()
        self._send(AwaitResult(sid), reply)
        try:
            return reply.get(1e9 if timeout is None else timeout)  # type: ignore[no-any-return]
        except AskTimeoutError:
            return None
        finally:
            if not reply.done:
                self._tell(Call(ForgetWaiter(sid, reply)))

    def result(self, session_id: uuid.UUID | SessionRef) -> SessionResult | None:
        """The session's result if it has ended, else None (never waits)."""
        return self._call(GetResult(_sid(session_id)), check=False)

    def results(self, session_id: uuid.UUID | SessionRef) -> list[SessionResult]:
        """The child results a session has received (most recent ones)."""
        return self._call(GetResults(_sid(session_id)), check=False)

    def stuck(self) -> list[SessionInfo]:
        """Sessions flagged as stuck."""
        return self._call(ListStuck(), check=False)

    def stats(self) -> dict[str, int]:
        """Counters and gauges: live sessions, zombies, refusals, slots…"""
        stats = self._call(GetStats(), check=False)
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

    def inspect(
        self,
        session_id: uuid.UUID | SessionRef,
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
        if in_actor_handler():
            msg = "an actor handler may not block on an ask (deadlock); tell instead"
            raise DeadlockError(msg)
        ref = self._call(GetActorRef(_sid(session_id)), check=False)
        if ref is None:
            parked, value, error = self._call(ProbeParked(_sid(session_id), probe), check=False)
            if error is not None:
                raise error
            if parked:
                return value
        if ref is None or not ref.is_alive():
            msg = f"session {_sid(session_id)} has no running actor"
            raise UnknownSessionError(msg, session_id=_sid(session_id))
        try:  # not counted in activity: a diagnostic read, never work of the tree
            return ref.ask(Inspect(probe), timeout=timeout or self.config.ask_timeout)
        except pykka.ActorDeadError as exc:
            msg = f"session {_sid(session_id)} stopped before answering"
            raise UnknownSessionError(msg, session_id=_sid(session_id)) from exc

    def housekeep(self) -> dict[str, Any]:
        """Run the store's housekeeping now: the export to ``config.export_path``
        and the pruning past ``config.prune_after`` (each only when configured).
        Raises ``NodeClosedError`` without a store; ``OSError`` when the export
        cannot be written (then nothing is pruned)."""
        if self._housekeeper is None:
            msg = "this node has no store to keep"
            raise NodeClosedError(msg)
        return self._housekeeper.run()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until every mailbox is empty and every skill is blocked at a
        checkpoint, parked or finished; False if ``timeout`` real seconds pass."""
        return self.activity.wait_idle(timeout)

    # -- awaitable twins ------------------------------------------------------------

    async def amain(self, agent_id: str, key: str = "internal:main:main") -> SessionRef:
        return SessionRef(self, await self._acall(OpenMain(agent_id, key)))

    async def aspawn(
        self, parent: uuid.UUID | SessionRef, spec: SpawnSpec | None = None, /, **fields: Any
    ) -> Spawned:
        return self._spawned(await self._acall(Spawn(_sid(parent), make_spec(spec, **fields))))

    async def aspawn_many(
        self, parent: uuid.UUID | SessionRef, specs: Iterable[SpawnSpec]
    ) -> list[Spawned]:
        """Awaitable ``spawn_many``."""
        return self._all_spawned(await self._acall(SpawnMany(_sid(parent), spawn_batch(specs))))

    async def arun(
        self,
        parent: uuid.UUID | SessionRef,
        spec: SpawnSpec | None = None,
        /,
        timeout: float | None = None,
        **fields: Any,
    ) -> SessionResult | None:
        spawned = await self.aspawn(parent, make_spec(spec, **fields))
        if spawned.ref is None:
            return _refused(spawned.error)
        return await self.await_result(spawned.ref, timeout)

    async def aget(self, session_id: uuid.UUID | SessionRef) -> SessionInfo:
        return await self._acall(GetInfo(_sid(session_id)))

    async def acancel(self, session_id: uuid.UUID | SessionRef) -> ErrorInfo | None:
        return await self._acall(Cancel(_sid(session_id)))

    async def asuspend(self, session_id: uuid.UUID | SessionRef) -> ErrorInfo | None:
        return await self._acall(Suspend(_sid(session_id)))

    async def aresume(self, session_id: uuid.UUID | SessionRef) -> ErrorInfo | None:
        return await self._acall(Resume(_sid(session_id)))

    async def aroute(self, inbound: object, agent_id: str | None = None) -> Routed:
        """Awaitable ``route`` (run off the event loop: it waits for durable writes)."""
        return await asyncio.to_thread(self.route, inbound, agent_id)

    async def asend(self, session_id: uuid.UUID | SessionRef, message: Any) -> ErrorInfo | None:
        return await self._acall(Send(_sid(session_id), message))

    async def await_result(
        self, session_id: uuid.UUID | SessionRef, timeout: float | None = None
    ) -> SessionResult | None:
        sid = _sid(session_id)
        reply = Reply()
        self._send(AwaitResult(sid), reply)
        try:
            return await reply.get_async(1e9 if timeout is None else timeout)  # type: ignore[no-any-return]
        except AskTimeoutError:
            return None
        finally:
            if not reply.done:  # timed out or cancelled: the Cortex forgets the waiter
                self._tell(Call(ForgetWaiter(sid, reply)))

    async def aresult(self, session_id: uuid.UUID | SessionRef) -> SessionResult | None:
        """Awaitable ``result``: the result if the session has ended, else None."""
        return await self._acall(GetResult(_sid(session_id)), check=False)

    async def aresults(self, session_id: uuid.UUID | SessionRef) -> list[SessionResult]:
        return await self._acall(GetResults(_sid(session_id)))

    async def atree(self, root: uuid.UUID | SessionRef) -> dict[str, Any]:
        return await self._acall(GetTree(_sid(root)))

    async def asessions(
        self, state: SessionState | None = None, kind: SessionKind | None = None
    ) -> list[SessionInfo]:
        return await self._acall(ListSessions(state, kind))

    async def astats(self) -> dict[str, int]:
        return await self._acall(GetStats())

    async def await_idle(self, timeout: float = 10.0) -> bool:
        """Awaitable ``wait_idle`` (runs the wait on a helper thread)."""
        return await asyncio.to_thread(self.activity.wait_idle, timeout)

    async def ashutdown(self, grace: float | None = None, timeout: float | None = None) -> None:
        """Awaitable ``shutdown``."""
        await asyncio.to_thread(self.shutdown, grace, timeout)

    # -- shutdown -----------------------------------------------------------------------

    def shutdown(self, grace: float | None = None, timeout: float | None = None) -> None:
        """Stop the node as DESIGN.md §3 says: Mains kept, running Branches suspended
        within the grace, Workers cancelled with grace (their parents told); then
        every actor, the executor and the loop stop. Idempotent.

        ``grace`` defaults to ``config.grace`` on the node's clock; ``timeout``
        bounds the real time spent waiting (default: grace + 5 s with the real
        clock, 5 s with another) — past it, what has not settled is forced.
        """
        with self._state_lock:
            if self._state != "open":
                return
            self._state = "closing"
        grace = self.config.grace if grace is None else grace
        if timeout is None:
            timeout = grace + 5.0 if isinstance(self.clock, RealClock) else 5.0
        try:
            if self.failure is None:
                reply = Reply()
                self._send(BeginShutdown(grace), reply)
                if self._forced:  # force_shutdown came first
                    self._force_now()
                try:
                    reply.get(timeout)
                except AskTimeoutError:
                    log.warning("shutdown did not settle in %.1f s; forcing", timeout)
                    self._call(ShutdownDeadline(), check=False)
                    self._call(ForceWorkers(), check=False)
                self.final_sessions = self._call(ListSessions(), check=False)
                self._call(StopAll(), check=False)
        except NodeClosedError:
            pass
        finally:
            self._cortex.stop(block=False)
            if self._dispatcher is not None:
                self._dispatcher.close()
            self._executor.close()
            self._main_executor.close()
            if self._loop is not None:
                self._loop.close()  # a remote step still awaited is killed here
            self.backends.close()
            if self._own_clock and isinstance(self.clock, RealClock):
                self.clock.close()
            if self._housekeeper is not None:
                self._housekeeper.stop()
            self._flush_store()
            self._close_owned()
            if self.config.gc_tuning:
                release_gc()
            self._state = "closed"
            self._stopped.set()

    def force_shutdown(self) -> None:
        """Cut a shutdown short: what still runs is forced now (the second
        signal of a standalone node). Called before ``shutdown`` began, the
        shutdown forces at once when it does; after it ended, does nothing."""
        with self._state_lock:
            self._forced = True
            closing = self._state == "closing"
        if closing and self.failure is None:
            self._force_now()

    def _force_now(self) -> None:
        try:
            self._call(ShutdownDeadline(), check=False, timeout=5.0)
        except (NodeClosedError, AskTimeoutError) as exc:
            log.warning("could not force the shutdown: %r", exc)

    def _flush_store(self) -> None:
        if self.store is None:
            return
        try:
            self.store.flush()
        except SessionTreeError as exc:
            log.error("the store could not be flushed at shutdown: %s", exc)

    def _close_owned(self) -> None:
        if self._own_store and self.store is not None:
            self.store.close()

    def wait_closed(self, timeout: float) -> bool:
        """Block until a shutdown (asked for, or after a fatal error) has finished."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _by_id(agents: Iterable[Agent]) -> dict[str, Agent]:
    """The agents by id; ``ValueError`` naming an agent registered twice."""
    by_id: dict[str, Agent] = {}
    for agent in agents:
        if agent.agent_id in by_id:
            msg = f"agent {agent.agent_id!r} is registered twice"
            raise ValueError(msg)
        by_id[agent.agent_id] = agent
    return by_id


def _backends_for(config: NodeConfig) -> Backends:
    return Backends(
        {
            "process": lambda: ProcessBackend(config.process_workers),
            "ray": lambda: RayBackend(
                config.ray_address, actors=config.ray_actors, num_cpus=config.ray_num_cpus
            ),
        }
    )


def _dispatcher_for(config: NodeConfig) -> Dispatcher | None:
    """The pool serving the node's session actors (None: a thread each)."""
    if config.actor_type != "pooled":
        return None
    return Dispatcher(
        config.dispatcher_threads,
        block_threshold=config.block_threshold,
        name="sessiontree-session",
    )


def _sid(value: uuid.UUID | SessionRef) -> uuid.UUID:
    return value.session_id if isinstance(value, SessionRef) else value


def _refused(error: ErrorInfo | None) -> SessionResult:
    return SessionResult(
        session_id=_NIL,
        status=SessionState.FAILED,
        error=error or ErrorInfo(code=ErrorCode.REJECTED_INPUT, message="spawn refused"),
    )
