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
import contextlib
import functools
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from sessiontree.actors import Compaction
from sessiontree.actors.runtime import ModelCall, RunEnd, SessionCore, copy_context
from sessiontree.conversations import Conversation, SessionBranch
from sessiontree.protocol import (
    TERMINAL_STATES,
    ChatMessage,
    Completion,
    ErrorInfo,
    NodeClosedError,
    PatternCall,
    RejectedInputError,
    SessionKind,
    SessionResult,
    SpawnSpec,
    as_json,
    child_traceparent,
)
from sessiontree.store import CycleRecord, Store, WriteBatch
from sessiontree.supervision._drivers import drive_async, drive_sync
from sessiontree.supervision._node_core import NodeCore
from sessiontree.supervision._refs import Spawned
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

log = logging.getLogger("sessiontree.session")


class NodeHost:
    """The ``SessionHost`` a node gives its sessions: everything goes to the Cortex."""

    def __init__(self, node: NodeCore) -> None:
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

    def _memory_scope(self, core: SessionCore) -> str:
        """The scope ``core``'s shared memory lives in: its Main's tree's
        (``tree:<Main id>``) on a node with ``memory_scope="tree"``, else its agent's."""
        if self.node.config.memory_scope == "tree":
            return f"tree:{core.info.conversation or core.session_id}"
        return core.info.agent_id

    def memory_put(self, core: SessionCore, key: str, value: Any) -> str:
        return self.node.memory.put(self._memory_scope(core), core.session_id, key, value)

    async def memory_put_async(self, core: SessionCore, key: str, value: Any) -> str:
        return await self.node.memory.aput(self._memory_scope(core), core.session_id, key, value)

    def memory_get(self, core: SessionCore, key: str) -> Any:
        return self.node.memory.get(self._memory_scope(core), key)

    def progress(self, core: SessionCore, note: str, data: dict[str, Any]) -> None:
        self.node._tell(Progress(core.session_id, note, dict(data)))

    def cancel(self, core: SessionCore, child_id: uuid.UUID) -> ErrorInfo | None:
        self.node._tell(Call(Cancel(child_id)))  # never blocks a skill's loop
        return None

    def send_to_parent(self, core: SessionCore, message: Any) -> None:
        self.node._tell(ChildUpdate(core.session_id, message))

    def run_pattern(self, session: Any, call: PatternCall) -> Any:
        return drive_sync(session, self.node._restarts, call)

    async def arun_pattern(self, session: Any, call: PatternCall) -> Any:
        return await drive_async(session, self.node._restarts, call)

    def conversation(
        self, core: SessionCore, guard: Callable[[str], None]
    ) -> Conversation | SessionBranch:
        linked = self.linked_context(core, guard)
        if linked is not None:
            return linked
        if core.info.kind is SessionKind.MAIN:  # its cycles' appends are keyed
            keys = functools.partial(_effect_id, core)
            return self.node.conversations.get(core.session_id, guard=guard, keys=keys)
        writable = core.info.kind is not SessionKind.WORKER
        return self.node.conversations.get(core.session_id, guard=guard, writable=writable)

    def record_input(self, core: SessionCore, message: Any) -> None:
        content = _NOTHING if _recorded(core) else _user_turn(message)
        if content is not _NOTHING:
            self._conversation(core).append("user", content)

    async def arecord_input(self, core: SessionCore, message: Any) -> None:
        content = _NOTHING if _recorded(core) else _user_turn(message)
        if content is not _NOTHING:
            await self._conversation(core).aappend("user", content)

    def _conversation(self, core: SessionCore) -> Conversation:
        """A Main's conversation as its running cycle writes it (keyed appends)."""
        keys = functools.partial(_effect_id, core)
        return self.node.conversations.get(core.session_id, keys=keys)

    def _post_turn(self, core: SessionCore, message: Any) -> concurrent.futures.Future[None] | None:
        """Queue the user's turn of a cycle starting for ``message`` (its future;
        None when there is none to record, or it cannot be queued without
        waiting: then the run records it)."""
        content = _user_turn(message)
        cycle_input = core.cycle_input
        if content is _NOTHING or cycle_input is None:
            return None
        try:
            turn = self._conversation(core).post_append("user", content)
        except Exception:  # noqa: BLE001 - a closed store: the run records it, or fails
            return None
        cycle_input.recorded = turn is not None
        return turn

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
        self,
        core: SessionCore,
        seq: int | None,
        child_id: uuid.UUID | None,
        attempt: int,
        message: Any = None,
    ) -> concurrent.futures.Future[None] | None:
        store = self.parts.store
        if store is None:
            return None
        cycle_input = core.cycle_input
        if cycle_input is not None:  # put back if the store refuses the cycle
            cycle_input.context = copy_context(core.context)
        # The user's turn is queued just before the mark: the writer commits in
        # order, so it shares the mark's commit (or an earlier one), and it is
        # settled by the time the mark is.
        turn = self._post_turn(core, message)
        mark = CycleRecord(
            session_id=core.session_id,
            seq=seq,
            child_id=child_id,
            attempt=attempt,
            started_at=self.parts.clock.time(),
            trace=core.cycle_trace,
        )
        # While the store takes writes a fresh input's cycle runs at once: nothing
        # outside the process waits for its mark, and reading ``session.attempt``
        # waits for it (``mark_durable``). One replayed after a restart waits, so
        # a crash it causes again is counted (a poison message is held back);
        # so does one that recorded the user's turn, whose replies build on it;
        # and, while the store refuses writes, every one, so that a cycle it
        # cannot record never runs (its input is kept for a retry).
        replayed = cycle_input is not None and not cycle_input.fresh
        wait = turn is not None or replayed or store.refusing
        try:
            marked = store.submit(WriteBatch().cycle(mark), lazy=not wait)
        except Exception as exc:  # noqa: BLE001 - a closed store: the cycle runs, the mark failed
            marked = concurrent.futures.Future()
            marked.set_exception(exc)
        core.mark_durable = functools.partial(_wait_for, marked, store)
        if wait:
            return marked if turn is None else _both(turn, marked)
        marked.add_done_callback(functools.partial(_mark_failed, core.session_id))
        return None

    def refused(self, core: SessionCore, what: str) -> None:
        self.node._tell(Refused(core.session_id, what))


_NOTHING = object()


def _recorded(core: SessionCore) -> bool:
    """Whether the running cycle's user's turn was written with its start."""
    cycle_input = core.cycle_input
    return cycle_input is not None and cycle_input.recorded


def _mark_failed(session_id: uuid.UUID, marked: concurrent.futures.Future[None]) -> None:
    error = marked.exception()
    if error is not None:
        log.error("session %s: the start of a cycle could not be recorded: %s", session_id, error)


def _wait_for(written: concurrent.futures.Future[None], store: Store) -> None:
    """Wait until ``written`` is durable (hurried: someone waits); its failure is
    the writer's to report, and a store that hangs is given up on after a minute."""
    if written.done():
        return
    store.hurry()
    with contextlib.suppress(Exception):
        written.result(timeout=60.0)


def _both(
    first: concurrent.futures.Future[None], second: concurrent.futures.Future[None]
) -> concurrent.futures.Future[None]:
    """A future that finishes once both have: failed with the first's error,
    else the second's, else done."""
    both: concurrent.futures.Future[None] = concurrent.futures.Future()
    lock = threading.Lock()

    def settle(_: concurrent.futures.Future[None]) -> None:
        with lock:
            if both.done() or not (first.done() and second.done()):
                return
            error = first.exception() or second.exception()
            if error is None:
                both.set_result(None)
            else:
                both.set_exception(error)

    first.add_done_callback(settle)
    second.add_done_callback(settle)
    return both


def _user_turn(message: Any) -> Any:
    """What a Main's conversation records of an inbound ``message`` (the user's
    turn): the message as a JSON value; ``_NOTHING`` for a child's result, a
    routed chat message (``route`` appended it already) or a value that is not
    JSON (or is larger than a message's content may be)."""
    if isinstance(message, SessionResult) or ChatMessage.of(message) is not None:
        return _NOTHING
    try:
        return as_json("message", message)
    except RejectedInputError:
        return _NOTHING


def _effect_id(core: SessionCore) -> tuple[uuid.UUID, bool] | None:
    """The message id of a Main's next conversation append in its running cycle,
    named after the cycle's input and the append's place in the cycle so a
    rerun of the cycle writes to the same ids, and whether an earlier run may
    hold it (None outside a cycle)."""
    key = core.next_effect()
    if key is None:
        return None
    name, place, rerun = key
    return uuid.uuid5(core.session_id, f"{name}/{place}"), rerun


def _in_cycle(parent: SessionCore, spec: SpawnSpec) -> SpawnSpec:
    """``spec`` from a traced Main's cycle: its child's span continues the
    cycle's (a Branch's children continue the Branch's span without help)."""
    if parent.cycle_trace is None or spec.trace is not None:
        return spec
    return msgspec.structs.replace(spec, trace=parent.cycle_trace)
