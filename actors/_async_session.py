"""``AsyncSession``: the handle an async skill receives (its calls are awaited
on the node's loop; none blocks it).

Every method is a checkpoint (see ``_handle_base``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Unpack, cast

from sessiontree.actors._compaction import summary_call
from sessiontree.actors._completing import as_entries, exchanged, model_call, tool_result
from sessiontree.actors._context import ContextMessage
from sessiontree.actors._conversing import LinkedContext
from sessiontree.actors._handle_base import (
    HandleBase,
    context_message,
    landing,
    never,
    usage_of,
)
from sessiontree.actors._host import SpawnedLike
from sessiontree.protocol import (
    Collected,
    Completion,
    ContinueOptions,
    ContinueRun,
    ErrorInfo,
    FanOut,
    FanOutOptions,
    Gathered,
    MapReduce,
    MapReduceOptions,
    Pipeline,
    PipelineOptions,
    QuorumCollect,
    SessionResult,
    SpawnSpec,
    as_json,
    make_spec,
    spawn_batch,
)

__all__ = ["AsyncSession"]


class AsyncSession(HandleBase):
    """The handle an async skill gets: the same methods, awaited; no thread is held."""

    async def checkpoint(self) -> None:
        """Raise ``Cancelled`` if cancellation is pending; park if suspension is."""
        await self._checkpoint("checkpoint")

    async def _checkpoint(self, what: str, again: bool = False) -> None:
        if self._raise_if_cancelled(what, again):
            await self._park(what)

    async def _park(self, what: str) -> None:
        """Park until the suspension is lifted, then checkpoint again (and park
        again if suspended again). ``Cancelled`` as at any checkpoint."""
        core = self._core
        while True:
            self._host.parked(core)
            await core.block_until_async(lambda: not core.suspend_requested, None, parking=True)
            self._unpark()
            if not self._raise_if_cancelled(what, again=True):
                return

    async def spawn(self, spec: SpawnSpec | None = None, /, **fields: Any) -> SpawnedLike:
        """Spawn a child; see ``Session.spawn``."""
        spec = make_spec(spec, **fields)
        await self._checkpoint("spawn")
        spawned = await self._host.spawn_async(self._core, spec)
        self._remember([spec], [spawned])
        return spawned

    async def spawn_many(self, specs: Iterable[SpawnSpec]) -> list[SpawnedLike]:
        """Spawn a batch of children; see ``Session.spawn_many``."""
        batch = spawn_batch(specs)
        await self._checkpoint("spawn")
        answers = list(await self._host.spawn_many_async(self._core, batch))
        self._remember(batch, answers)
        return answers

    async def _wait_for(self, ready: Callable[[], bool], timeout: float | None) -> None:
        """``Session._wait_for`` without holding a thread."""
        core = self._core
        deadline = None if timeout is None else core.clock.monotonic() + timeout
        again = False
        while True:
            # the checkpoint, inline: a coroutine (and a frame for Cancelled to
            # unwind through) only when it parks
            if self._raise_if_cancelled("checkpoint", again):
                await self._park("checkpoint")
            again = True
            if ready():
                return
            remaining = None if deadline is None else deadline - core.clock.monotonic()
            if remaining is not None and remaining <= 0:
                return
            await core.block_until_async(ready, remaining)

    async def wait(self, child: uuid.UUID, timeout: float | None = None) -> SessionResult | None:
        """Wait for one child's result; see ``Session.wait``."""
        core = self._core
        await self._wait_for(lambda: child in core.unclaimed, timeout)
        with core.cond:
            result = self._claim(child)
        if core.tape is not None:
            self._taped([Collected(session_id=child, result=result, timed_out=result is None)])
        return result

    async def collect(
        self,
        children: Iterable[uuid.UUID] | None = None,
        timeout: float | None = None,
        *,
        quorum: int | None = None,
        aggregate: str | None = None,
    ) -> list[Collected]:
        """Wait for children and take their results; see ``Session.collect``."""
        wanted = self._wanted(children)
        if quorum is not None:
            call = QuorumCollect(wanted, quorum, timeout, aggregate)
            return cast("list[Collected]", await self._host.arun_pattern(self, call))
        await self._wait_for(lambda: self._claim_ready(wanted), timeout)
        return self._collected(wanted)

    async def next_result(
        self, children: Iterable[uuid.UUID] | None = None, timeout: float | None = None
    ) -> Collected | None:
        """Wait for the first of ``children`` to end; see ``Session.next_result``."""
        wanted = self._wanted(children)
        if not wanted:
            return None
        await self._wait_for(lambda: self._first_arrived(wanted) is not None, timeout)
        return self._take_first(wanted)

    async def next_results(
        self, children: Iterable[uuid.UUID] | None = None, timeout: float | None = None
    ) -> list[Collected]:
        """Every arrived result of ``children`` once one has; see ``Session.next_results``."""
        wanted = self._wanted(children)
        if not wanted:
            return []
        await self._wait_for(lambda: self._first_arrived(wanted) is not None, timeout)
        return self._take_arrived(wanted)

    async def collect_from_children(
        self, timeout: float | None = None, children: Iterable[uuid.UUID] | None = None
    ) -> AsyncIterator[Collected]:
        """Results as they arrive; see ``Session.collect_from_children``."""
        wanted = self._wanted(children)
        deadline = None if timeout is None else self._core.clock.monotonic() + timeout
        while wanted:
            left = None if deadline is None else max(0.0, deadline - self._core.clock.monotonic())
            got = await self.next_result(wanted, left)
            if got is None:
                for child in wanted:
                    yield Collected(session_id=child, result=None, timed_out=True)
                return
            wanted.remove(got.session_id)
            yield got

    async def cancel_child(self, child: uuid.UUID) -> ErrorInfo | None:
        """Cancel a child of this run; see ``Session.cancel_child``."""
        await self._checkpoint("cancel_child")
        self._check_child(child)
        if self._core.tape is not None:
            self._core.tape.cancelled_child(child)
        return self._host.cancel(self._core, child)

    async def send_to_parent(self, message: Any) -> None:
        """Hand ``message`` to the parent; see ``Session.send_to_parent``."""
        await self._checkpoint("send_to_parent")
        self._host.send_to_parent(self._core, as_json("message", message))

    async def broadcast(self, key: str, value: Any) -> str:
        """Share ``value`` with siblings in shared memory; see ``Session.broadcast``."""
        return await self.memory_put(key, value)

    async def fan_out(self, tasks: Iterable[Any], **options: Unpack[FanOutOptions]) -> Gathered:
        """One child per task; see ``Session.fan_out``."""
        call = FanOut(list(tasks), options)
        return cast("Gathered", await self._host.arun_pattern(self, call))

    async def pipeline(self, stages: Iterable[Any], **options: Unpack[PipelineOptions]) -> Gathered:
        """Stages in order; see ``Session.pipeline``."""
        call = Pipeline(list(stages), options)
        return cast("Gathered", await self._host.arun_pattern(self, call))

    async def map_reduce(
        self,
        items: Iterable[Any],
        map_task: Any,
        reduce_task: Any,
        **options: Unpack[MapReduceOptions],
    ) -> Gathered:
        """Map, then reduce; see ``Session.map_reduce``."""
        call = MapReduce(list(items), map_task, reduce_task, options)
        return cast("Gathered", await self._host.arun_pattern(self, call))

    async def continue_run(
        self, token: str, context: str, **options: Unpack[ContinueOptions]
    ) -> Gathered:
        """Continue an earlier run; see ``Session.continue_run``."""
        call = ContinueRun(token, context, options)
        return cast("Gathered", await self._host.arun_pattern(self, call))

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on the session's clock; see ``Session.sleep``."""
        await self._wait_for(never, seconds)
        await self._checkpoint("checkpoint", again=True)

    async def memory_put(self, key: str, value: Any) -> str:
        """Write shared memory; see ``Session.memory_put``."""
        await self._checkpoint("memory_put")
        self._check_memory_write()
        return await self._host.memory_put_async(self._core, key, value)

    async def memory_get(self, key: str) -> Any:
        """Read shared memory; see ``Session.memory_get``."""
        await self._checkpoint("memory_get")
        return self._host.memory_get(self._core, key)

    async def progress(self, note: str = "", **data: Any) -> None:
        """Report progress; see ``Session.progress``."""
        await self._checkpoint("progress")
        self._host.progress(self._core, note, data)

    async def complete(
        self,
        prompt: str | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
        stream: bool = False,
        record: bool | None = None,
        **options: Any,
    ) -> Completion:
        """Call the agent's chat model; see ``Session.complete``."""
        linked = self._linked() if messages is None or record else None
        history = linked if messages is None else None
        if history is not None:
            await history.settled()
        args = (prompt, messages, max_tokens, model, stream)
        call = model_call(self._core, *args, dict(options), history)  # checked first
        if history is not None and history.compact_due:
            await self._compact(history)
            call = model_call(self._core, *args, options, history)  # the shorter context
        await self._checkpoint("complete")
        pending = self._host.amodel_call(self._core, call)
        self._wake_when_done(pending)
        core = self._core
        try:
            while True:
                lands = landing(core)
                if not lands:
                    await self._checkpoint("complete", again=True)
                if pending.done():
                    break
                await core.block_until_async(pending.done, None, landing=lands)
        except BaseException:
            pending.cancel()
            raise
        completion = pending.result()
        if record if record is not None else messages is None:
            said = exchanged(prompt, completion)
            if linked is None:
                self._core.context.messages.extend(said)
            elif said:
                await linked.awrite(as_entries(said), usage_of(completion))
        if history is not None:
            self._note_length(history, completion)
        return completion

    async def _compact(self, linked: LinkedContext) -> None:
        """Replace the context's oldest messages by one summary; see ``Session._compact``."""
        planned = self._compaction(linked)
        if planned is None:
            return
        rule, old, chat = planned
        text: str | None
        if rule.summarise is not None:
            text = rule.summarise(chat)
        else:
            text = (await self.complete(messages=summary_call(chat), record=False)).text
        if text:
            await linked.acompact(text, old)

    async def add_tool_result(
        self, tool_call_id: str, content: Any, name: str | None = None
    ) -> None:
        """Append a tool's result to the context; see ``Session.add_tool_result``."""
        await self._add(tool_result(tool_call_id, content, name), "add_tool_result")

    async def add_message(self, role: str, content: Any, name: str | None = None) -> None:
        """Append a message to this session's context; see ``Session.add_message``."""
        await self._add(context_message(role, content, name), "add_message")

    async def _add(self, message: ContextMessage, what: str) -> None:
        await self._checkpoint(what)
        linked = self._linked()
        if linked is None:
            self._core.context.messages.append(message)
        else:
            await linked.awrite(as_entries([message]))
