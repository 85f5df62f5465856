"""``NodeHost``: the ``SessionHost`` a node gives its sessions.

A running skill's ``Session`` calls reach the node through it: spawns and
batches of spawns, shared memory, progress, cancelling a child, messages to
the parent, model calls, the coordination patterns, the conversation, and the ends of
runs (batched per pass of the event loop). Everything goes to the Cortex as
a typed request or message; nothing here decides.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from sessiontree.actors import Compaction
from sessiontree.actors.runtime import ModelCall, RunEnd, SessionCore
from sessiontree.conversations import Conversation, SessionBranch
from sessiontree.protocol import (
    TERMINAL_STATES,
    Completion,
    ErrorInfo,
    NodeClosedError,
    SessionKind,
    SpawnSpec,
    child_traceparent,
)
from sessiontree.store import CycleRecord, WriteBatch
from sessiontree.supervision._drivers import drive_async, drive_sync
from sessiontree.supervision._refs import NodeSessions, Spawned
from sessiontree.supervision._reports import (
    ChildUpdate,
    CycleStarted,
    Parked,
    Progress,
    Refused,
    RunEnded,
    RunsEnded,
)
from sessiontree.supervision._requests import Call, Cancel, Spawn, SpawnMany

__all__ = ["NodeHost"]


class NodeHost:
    """The ``SessionHost`` a node gives its sessions: everything goes to the Cortex."""

    def __init__(self, node: NodeSessions) -> None:
        self.node = node
        self.parts = node._parts  # read at every run's end: one hop fewer
        self._ended: list[RunEnded] = []  # touched on the event loop thread only

    # A skill spawning while the node shuts down gets node_closed back as a
    # value, like any refused spawn (once the shutdown let the skills go, the
    # spawn's checkpoint raises Cancelled(node_closed) before this is reached).
    def spawn(self, parent: SessionCore, spec: SpawnSpec) -> Spawned:
        spec = self.parts.contexts.fork_point(parent.info, _in_cycle(parent, spec))
        try:
            answer = self.node._call(Spawn(parent.session_id, spec, by_skill=True), check=False)
        except NodeClosedError as exc:
            return Spawned(None, exc.to_info())
        return self.node._spawned(answer)

    async def spawn_async(self, parent: SessionCore, spec: SpawnSpec) -> Spawned:
        spec = self.parts.contexts.fork_point(parent.info, _in_cycle(parent, spec))
        try:
            answer = await self.node._acall(
                Spawn(parent.session_id, spec, by_skill=True), check=False
            )
        except NodeClosedError as exc:
            return Spawned(None, exc.to_info())
        return self.node._spawned(answer)

    def spawn_many(self, parent: SessionCore, specs: tuple[SpawnSpec, ...]) -> list[Spawned]:
        if parent.cycle_trace is not None:
            specs = tuple(_in_cycle(parent, spec) for spec in specs)
        specs = self.parts.contexts.fork_points(parent.info, specs)
        try:
            answers = self.node._call(
                SpawnMany(parent.session_id, specs, by_skill=True), check=False
            )
        except NodeClosedError as exc:
            return [Spawned(None, exc.to_info()) for _ in specs]
        return self.node._all_spawned(answers)

    async def spawn_many_async(
        self, parent: SessionCore, specs: tuple[SpawnSpec, ...]
    ) -> list[Spawned]:
        if parent.cycle_trace is not None:
            specs = tuple(_in_cycle(parent, spec) for spec in specs)
        specs = self.parts.contexts.fork_points(parent.info, specs)
        try:
            answers = await self.node._acall(
                SpawnMany(parent.session_id, specs, by_skill=True), check=False
            )
        except NodeClosedError as exc:
            return [Spawned(None, exc.to_info()) for _ in specs]
        return self.node._all_spawned(answers)

    def model_call(
        self, core: SessionCore, call: ModelCall
    ) -> concurrent.futures.Future[Completion]:
        return self.node._model_calls.start(core, call)

    def amodel_call(self, core: SessionCore, call: ModelCall) -> asyncio.Future[Completion]:
        return self.node._model_calls.start_here(core, call)

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

    def conversation(
        self, core: SessionCore, guard: Callable[[str], None]
    ) -> Conversation | SessionBranch:
        linked = self.linked_context(core, guard)
        if linked is not None:
            return linked
        writable = core.info.kind is not SessionKind.WORKER
        return self.node.conversations.get(core.session_id, guard=guard, writable=writable)

    def compaction(self, core: SessionCore) -> Compaction | None:
        return self.node._runtime.agents[core.info.agent_id].compaction

    def linked_context(
        self, core: SessionCore, guard: Callable[[str], None]
    ) -> SessionBranch | None:
        info = core.info
        if info.kind is SessionKind.MAIN or info.conversation is None:
            return None
        if core.fenced or core.state in TERMINAL_STATES:  # its result landed: keep nothing
            return self.parts.contexts.detached(info, guard)
        return self.parts.contexts.branch(info, guard)

    def parked(self, core: SessionCore) -> None:
        self.node._tell(Parked(core.session_id))

    def run_ended(self, core: SessionCore, end: RunEnd) -> None:
        tape = core.tape
        if tape is not None and tape.replaying:  # it ends in its recorded turn
            tape.end_run(functools.partial(self.node._tell, RunEnded(core.session_id, end)))
            return
        loop = self.parts.loop
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

    def cycle_traced(
        self, core: SessionCore, cycle: int, parent: str | None, cut_off: str | None
    ) -> str | None:
        tracing = self.parts.config.tracing
        if tracing is None:
            return None
        trace = child_traceparent(parent, tracing.sampling_ratio)
        at = self.parts.clock.time()
        self.node._tell(CycleStarted(core.session_id, cycle, trace, parent, cut_off, at))
        return trace

    def cycle_starting(
        self, core: SessionCore, seq: int | None, child_id: uuid.UUID | None, attempt: int
    ) -> concurrent.futures.Future[None] | None:
        store = self.parts.store
        if store is None:
            return None
        mark = CycleRecord(
            session_id=core.session_id,
            seq=seq,
            child_id=child_id,
            attempt=attempt,
            started_at=self.parts.clock.time(),
            trace=core.cycle_trace,
        )
        try:
            return store.submit(WriteBatch().cycle(mark))
        except Exception as exc:  # noqa: BLE001 - a closed store: the cycle runs, the mark failed
            failed: concurrent.futures.Future[None] = concurrent.futures.Future()
            failed.set_exception(exc)
            return failed

    def refused(self, core: SessionCore, what: str) -> None:
        self.node._tell(Refused(core.session_id, what))


def _in_cycle(parent: SessionCore, spec: SpawnSpec) -> SpawnSpec:
    """``spec`` from a traced Main's cycle: its child's span continues the
    cycle's (a Branch's children continue the Branch's span without help)."""
    if parent.cycle_trace is None or spec.trace is not None:
        return spec
    return msgspec.structs.replace(spec, trace=parent.cycle_trace)
