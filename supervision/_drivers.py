"""The drivers that run a pattern: for a sync ``Session``, an ``AsyncSession``,
or a ``Node`` acting for a parent session from outside the tree.

A driver starts the pattern a typed call names (``FanOut``, ``Pipeline``…,
from protocol), then answers each command
the engine yields (``_engine``) with the matching call: spawn, wait for the
first of some children, sleep on the clock, cancel a child, read the clock.
What the pattern returns is what the driver returns (a ``Gathered``; for
``collect``, its entries).

On failure: an option the pattern does not take raises
``RejectedInputError`` (field ``options``) before anything is spawned; a
pattern's own ``RejectedInputError`` and ``EscalationError`` propagate from
the driver to its caller.
"""

from __future__ import annotations

import queue
import threading
import uuid
from typing import TYPE_CHECKING, Any

from sessiontree.protocol import (
    ContinueRun,
    FanOut,
    MapReduce,
    PatternCall,
    Pipeline,
    QuorumCollect,
    RejectedInputError,
    SessionResult,
)
from sessiontree.supervision._engine import (
    Command,
    Program,
    _Cancel,
    _Note,
    _Now,
    _Sleep,
    _SpawnMany,
    _WaitSome,
)
from sessiontree.supervision._patterns import (
    collect,
    continue_run,
    fan_out,
    map_reduce,
    pipeline,
)
from sessiontree.supervision._retry import Restarts

if TYPE_CHECKING:
    from sessiontree.actors import AsyncSession, Session

__all__ = ["NodeDriver", "drive_async", "drive_sync"]


def _start(call: PatternCall, parent: uuid.UUID, restarts: Restarts) -> Program:
    """The pattern ``call`` names, started for ``parent``; ``RejectedInputError``
    (field ``options``) for an option it does not take (the options are typed,
    but an untyped caller may still pass any)."""
    try:
        match call:
            case FanOut(tasks=tasks, options=options):
                return fan_out(parent, restarts, tasks, **options)
            case Pipeline(stages=stages, options=options):
                return pipeline(parent, restarts, stages, **options)
            case MapReduce(items=items, map_task=map_task, reduce_task=reduce_task):
                return map_reduce(parent, restarts, items, map_task, reduce_task, **call.options)
            case ContinueRun(token=token, context=context, options=options):
                return continue_run(parent, restarts, token, context, **options)
            case QuorumCollect(children=children, quorum=quorum):
                return collect(
                    parent,
                    restarts,
                    children,
                    quorum=quorum,
                    timeout=call.timeout,
                    aggregate=call.aggregate,
                )
    except TypeError as exc:  # an unknown option
        name = type(call).__name__
        raise RejectedInputError(f"{name}: {exc}", field="options") from None
    msg = f"not a pattern call: {type(call).__name__}"
    raise RejectedInputError(msg, field="pattern")


def drive_sync(session: Session, restarts: Restarts, call: PatternCall) -> Any:
    """Run a pattern for a sync skill's ``Session`` (its thread waits). Raises what
    ``_start`` and the pattern raise (``RejectedInputError``, ``EscalationError``)."""
    engine = _start(call, session.session_id, restarts)
    answer: Any = None
    try:
        while True:
            command = engine.send(answer)
            match command:
                case _SpawnMany(specs=specs):
                    answer = session.spawn_many(specs)
                case _WaitSome(children=children, timeout=timeout):
                    got = session.next_results(children, timeout)
                    answer = [(c.session_id, c.result) for c in got]
                case _Sleep(seconds=seconds):
                    session.sleep(seconds)
                    answer = None
                case _Cancel(child=child):
                    answer = session.cancel_child(child)
                case _Now():
                    answer = session.clock.monotonic()
                case _Note(note=note, data=data):
                    session.progress(note, **data)
                    answer = None
    except StopIteration as stop:
        return stop.value


async def drive_async(session: AsyncSession, restarts: Restarts, call: PatternCall) -> Any:
    """Run a pattern for an async skill's ``AsyncSession`` (no thread held). Raises
    what ``_start`` and the pattern raise (``RejectedInputError``, ``EscalationError``)."""
    engine = _start(call, session.session_id, restarts)
    answer: Any = None
    try:
        while True:
            command = engine.send(answer)
            match command:
                case _SpawnMany(specs=specs):
                    answer = await session.spawn_many(specs)
                case _WaitSome(children=children, timeout=timeout):
                    got = await session.next_results(children, timeout)
                    answer = [(c.session_id, c.result) for c in got]
                case _Sleep(seconds=seconds):
                    await session.sleep(seconds)
                    answer = None
                case _Cancel(child=child):
                    answer = await session.cancel_child(child)
                case _Now():
                    answer = session.clock.monotonic()
                case _Note(note=note, data=data):
                    await session.progress(note, **data)
                    answer = None
    except StopIteration as stop:
        return stop.value


class NodeDriver:
    """Runs a pattern from outside the tree, for a parent session, on a ``Node``.

    Children end as events; the driver keeps its own queue of the ones it
    spawned, so waiting for the first of them costs no polling. Sleeps and
    timeouts run on the node's clock.
    """

    def __init__(self, node: Any, parent: uuid.UUID) -> None:
        self.node = node
        self.parent = parent
        self._ended: queue.SimpleQueue[uuid.UUID | None] = queue.SimpleQueue()
        self._mine: set[uuid.UUID] = set()
        self._results: dict[uuid.UUID, SessionResult] = {}

    def run(self, restarts: Restarts, call: PatternCall) -> Any:
        engine = _start(call, self.parent, restarts)
        unsubscribe = self.node.subscribe(self._observe)
        answer: Any = None
        try:
            while True:
                command = engine.send(answer)
                answer = self._do(command)
        except StopIteration as stop:
            return stop.value
        finally:
            unsubscribe()

    def _observe(self, event: Any) -> None:
        """On the Cortex thread: note the end of a child of ours."""
        if (
            event.session_id in self._mine
            and event.kind == "transition"
            and event.state in ("completed", "failed", "expired", "cancelled")
        ):
            self._ended.put(event.session_id)

    def _do(self, command: Command) -> Any:
        node = self.node
        match command:
            case _SpawnMany(specs=specs):
                answers = node.spawn_many(self.parent, specs)
                for spawned in answers:
                    if spawned.session_id is not None:
                        self._mine.add(spawned.session_id)
                        if node.result(spawned.session_id) is not None:  # ended already
                            self._ended.put(spawned.session_id)
                return answers
            case _WaitSome(children=children, timeout=timeout):
                return self._wait_some(children, timeout)
            case _Sleep(seconds=seconds):
                self._sleep(seconds)
                return None
            case _Cancel(child=child):
                return node.cancel(child)
            case _Now():
                return node.clock.monotonic()
            case _Note():  # outside the tree: no session of ours to report on
                return None
        return None

    def _wait_some(
        self, children: tuple[uuid.UUID, ...], timeout: float | None
    ) -> list[tuple[uuid.UUID, SessionResult]]:
        """``_WaitSome``: the wanted children that ended, once at least one has."""
        wanted = set(children)
        ended = [(c, self._results.pop(c)) for c in children if c in self._results]
        if ended:
            return ended
        timer = None
        if timeout is not None:
            timer = self.node.clock.call_later(timeout, lambda: self._ended.put(None))
        try:
            block = True
            while True:
                try:
                    child = self._ended.get(block=block)
                except queue.Empty:
                    return ended  # every one that had ended by then
                if child is None:
                    if ended:
                        continue
                    return ended  # the timeout
                result = self.node.result(child)
                if result is None:
                    continue
                if child in wanted:  # told twice (spawned ended, then its event): once
                    wanted.discard(child)
                    ended.append((child, result))
                    block = False
                else:
                    self._results[child] = result
        finally:
            if timer is not None:
                timer.cancel()

    def _sleep(self, seconds: float) -> None:
        woken = threading.Event()
        timer = self.node.clock.call_later(seconds, woken.set)
        try:
            woken.wait()
        finally:
            timer.cancel()
