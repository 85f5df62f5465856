"""How a node is put together, started and taken apart.

``NodeParts`` makes everything a ``Node`` is built of besides its Cortex and
its own state — the clock, the store, shared memory, the conversations, the
event loop and the dispatcher that serves every actor on it, the two step
executors, the backends — and knows
the steps of a start that touch them: recovery from the store, starting the
node's own backend, the ``Runtime`` the Cortex drives, housekeeping. A step
that fails releases what the start had taken (``abort``) and raises out of
``Node()``; shutdown releases everything in order (``close``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec
import pykka

from sessiontree.actors import Clock, RealClock
from sessiontree.actors.backends import ProcessBackend, RayBackend
from sessiontree.actors.runtime import (
    Activity,
    Backends,
    ComputeSlots,
    EventLoopThread,
    LoopDispatcher,
    SessionHost,
    StepExecutor,
    actor_class,
    start_actor,
    stop_actor,
)
from sessiontree.conversations import Conversations, MemoryBackend
from sessiontree.protocol import NodeClosedError, SessionTreeError
from sessiontree.store import Store, WriteBatch
from sessiontree.supervision._config import Agent, NodeConfig
from sessiontree.supervision._contexts import Contexts
from sessiontree.supervision._conversations import StoreConversations
from sessiontree.supervision._cortex import Cortex
from sessiontree.supervision._events import EventBus
from sessiontree.supervision._extension import Extension, Extensions
from sessiontree.supervision._housekeeping import Housekeeper
from sessiontree.supervision._ledger import Ledgers
from sessiontree.supervision._memory import InMemorySpace, MemorySpace, StoreMemory
from sessiontree.supervision._models import Models
from sessiontree.supervision._persist import Persister
from sessiontree.supervision._recording import Recorder
from sessiontree.supervision._recovery import Recovered, recover
from sessiontree.supervision._runtime import Runtime
from sessiontree.supervision._slot_keeper import SlotKeeper
from sessiontree.supervision._span_ids import SpanIds

if TYPE_CHECKING:  # imported at run time only on a traced node
    from sessiontree.supervision._tracing import SpanRecorder

__all__ = ["NodeParts", "agents_by_id", "start_cortex"]

log = logging.getLogger("sessiontree.node")


def agents_by_id(agents: Iterable[Agent]) -> dict[str, Agent]:
    """The agents by id; ``ValueError`` naming an agent registered twice."""
    by_id: dict[str, Agent] = {}
    for agent in agents:
        if agent.agent_id in by_id:
            msg = f"agent {agent.agent_id!r} is registered twice"
            raise ValueError(msg)
        by_id[agent.agent_id] = agent
    return by_id


def start_cortex(runtime: Runtime) -> pykka.ActorRef[Any]:
    """Start the Cortex actor over ``runtime`` and wait until it has started
    (``NodeClosedError`` if it does not within ``ask_timeout``). It decides
    every change of the tree, on the event loop with the sessions' actors."""
    ref = start_actor(actor_class(Cortex, runtime.dispatcher), runtime)
    # Its start (the periodic check's first timer) happens on its own turn of
    # the loop: a node is started once that is done, whatever the clock does next.
    if not runtime.started.wait(runtime.config.ask_timeout):
        stop_actor(ref)
        msg = f"the cortex did not start within {runtime.config.ask_timeout} s"
        raise NodeClosedError(msg)
    return ref


class NodeParts:
    """The pieces of one node, made in the order ``Node()`` needs them.

    ``clock``: the caller's, or a ``RealClock`` the node owns (and closes).
    ``store``: a ``Store`` (the caller closes it), a directory (opened here,
    closed by ``abort``/``close``; ``StoreLockedError`` if another node holds
    it) or None. ``memory``: the caller's, else in the store or in memory.
    ``loop``: an application's running loop to adopt (``Node.astart``), else
    the node makes its own.
    """

    def __init__(
        self,
        config: NodeConfig,
        *,
        clock: Clock | None,
        memory: MemorySpace | None,
        store: Store | str | os.PathLike[str] | None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config
        self.adopt = loop
        self.own_clock = clock is None
        self.clock: Clock = clock or RealClock()
        self.own_store = store is not None and not isinstance(store, Store)
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
        self.contexts = Contexts(self.conversations)  # spawned sessions' branches of them
        self.loop: EventLoopThread | None = None
        """The event loop for every actor and every async skill (made with the
        dispatcher that serves the actors on it)."""
        self._loop_lock = threading.Lock()
        # the node's actors are served on its loop: it starts with the node (an
        # application's running loop, adopted now off its thread: see EventLoopThread)
        self.dispatcher = LoopDispatcher(self.event_loop(), block_threshold=config.block_threshold)
        self.executor = StepExecutor(config.max_step_threads)
        self.main_executor = StepExecutor(config.max_step_threads, "sessiontree-step-main")
        self.backends = _backends_for(config)
        self.models: Models | None = None  # set with the runtime
        self.housekeeper: Housekeeper | None = None
        self.replay_held: str | None = None  # why recovery held replay back, until released
        self.spans = _span_recorder(config, self.clock)  # a traced node's (None: not traced)

    def event_loop(self) -> EventLoopThread:
        """The node's event loop, made on first use."""
        loop = self.loop  # once made, it stays: no lock to read it (a run starts each)
        if loop is not None:
            return loop
        with self._loop_lock:
            if self.loop is None:
                self.loop = EventLoopThread(loop=self.adopt)
            return self.loop

    # -- the steps of a start ------------------------------------------------------

    def recover(self, agents: dict[str, Agent]) -> Recovered | None:
        """Read the store and durably end what recovery decides (None without a
        store). Raises ``StoreError`` if those writes fail, after ``abort``."""
        if self.store is None:
            return None
        try:
            return recover(self.store, agents, self.clock.time(), self.config)
        except BaseException:
            self.abort()
            raise

    def start_backend(self) -> None:
        """The node's backend starts with it; one that cannot raises (after ``abort``)."""
        if self.config.backend == "inline":
            return
        try:
            self.backends.get(self.config.backend)
        except BaseException:
            self.abort()
            raise

    def runtime(
        self,
        *,
        agents: dict[str, Agent],
        activity: Activity,
        events: EventBus,
        host: SessionHost,
        on_fatal: Callable[[BaseException], None],
        on_failed: Callable[[BaseException], None],
        recovered: Recovered | None,
        models: Models,
    ) -> Runtime:
        """The pieces the Cortex drives, with the node's callbacks."""
        self.models = models
        counters: collections.Counter[str] = collections.Counter()
        return Runtime(
            config=self.config,
            clock=self.clock,
            activity=activity,
            slots=ComputeSlots(self.config.max_running_skills),
            executor=self.executor,
            main_executor=self.main_executor,
            loop=self.event_loop,
            events=events,
            host=host,
            agents=agents,
            on_fatal=on_fatal,
            on_failed=on_failed,
            persist=Persister(self.store, counters),
            recovered=recovered,
            counters=counters,
            dispatcher=self.dispatcher,
            backends=self.backends,
            models=models,
            extensions=Extensions(self._extensions()),
        )

    def _extensions(self) -> list[Extension]:
        """The features the node attaches to its kernel: budgets, recording and
        context branches always (any spawn may use them), the Cortex's side of
        moving a slot with a store (a slot moves from store to store), span
        ids on a traced node."""
        config = self.config
        extensions: list[Extension] = [
            Ledgers(),
            Recorder(self.store, self.clock, config.grace, config.providers),
            self.contexts,
        ]
        if self.store is not None:
            extensions.append(SlotKeeper())
        if config.tracing is not None:
            extensions.append(SpanIds(config.tracing.sampling_ratio))
        return extensions

    def start_housekeeping(self) -> None:
        """Start the store's export and pruning schedule (none without a store)."""
        if self.store is None:
            return
        self.housekeeper = Housekeeper(self.store, self.config, self.clock)
        self.housekeeper.start()

    # -- taking apart --------------------------------------------------------------

    def abort(self) -> None:
        """``Node()`` failed: release what it had taken (the dispatcher, the
        event loop, started backends, a store it opened)."""
        self.dispatcher.close()
        if self.loop is not None:
            self.loop.close()
        self.backends.close()
        if self.spans is not None:
            self.spans.close(self.clock.time())
        self._close_owned_store()

    def close(self) -> None:
        """The end of a shutdown, once the Cortex is told to stop: the pools, the
        event loop (a remote step still awaited is killed here), the backends, an
        owned clock, housekeeping; then the store is flushed (an error is
        logged, not raised) and, if the node opened it, closed."""
        self.dispatcher.close()
        self.executor.close()
        self.main_executor.close()
        if self.loop is not None:
            self._close_models(self.loop)
            self.loop.close()
        self.backends.close()
        if self.own_clock and isinstance(self.clock, RealClock):
            self.clock.close()
        if self.housekeeper is not None:
            self.housekeeper.stop()
        if self.spans is not None:  # the spans still open end here, then the queue goes out
            self.spans.close(self.clock.time())
        self._flush_store()
        self._close_owned_store()

    def _close_models(self, loop: EventLoopThread) -> None:
        """Close the model clients' connection pools on the loop they ran on."""
        if self.models is None:
            return
        closing = asyncio.run_coroutine_threadsafe(self.models.close(), loop.loop)
        try:
            closing.result(timeout=5.0)
        except Exception as exc:  # noqa: BLE001 - a pool that fails to close is only logged
            log.warning("model clients did not close cleanly: %r", exc)

    def _flush_store(self) -> None:
        """Commit what is queued, and that this run stopped cleanly: its next
        start does not count it as a crash for the restart intensity, and a
        Main's cycle the shutdown let go runs again as it was, not as a run a
        crash cut off (unless replay is held: then the counts are kept)."""
        if self.store is None:
            return
        try:
            starts = self.store.starts()
            if starts is not None and starts.running:
                batch = WriteBatch().starts(msgspec.structs.replace(starts, running=False))
                if self.replay_held is None:
                    batch.no_cycles()
                self.store.write(batch)
            else:
                self.store.flush()
        except SessionTreeError as exc:
            log.error("the store could not be flushed at shutdown: %s", exc)

    def _close_owned_store(self) -> None:
        if self.own_store and self.store is not None:
            self.store.close()


def _span_recorder(config: NodeConfig, clock: Clock) -> SpanRecorder | None:
    """A traced node's ``SpanRecorder``: the SDK is imported only then.
    ``ImportError`` naming the extra when it is not installed."""
    if config.tracing is None:
        return None
    try:
        from sessiontree.supervision._tracing import SpanRecorder  # noqa: PLC0415 - only traced
    except ImportError as exc:
        msg = (
            "NodeConfig.tracing needs the OpenTelemetry SDK and its OTLP exporter: "
            f"pip install 'sessiontree[otlp]' ({exc})"
        )
        raise ImportError(msg) from exc
    return SpanRecorder(config.tracing, clock.monotonic)


def _backends_for(config: NodeConfig) -> Backends:
    return Backends(
        {
            "process": lambda: ProcessBackend(config.process_workers),
            "ray": lambda: RayBackend(
                config.ray_address, actors=config.ray_actors, num_cpus=config.ray_num_cpus
            ),
        }
    )
