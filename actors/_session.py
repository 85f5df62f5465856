"""``Session``: the handle a sync skill receives (its calls block its step thread).

Every method is a checkpoint (see ``_handle_base``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
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

__all__ = ["Session"]


class Session(HandleBase):
    """The handle a sync skill gets. Every method blocks the skill's own thread."""

    def _conversation_guard(self, what: str) -> None:
        self._checkpoint(what)

    def checkpoint(self) -> None:
        """Raise ``Cancelled`` if cancellation is pending; park if suspension is."""
        self._checkpoint("checkpoint")

    def _checkpoint(self, what: str, again: bool = False) -> None:
        while self._raise_if_cancelled(what, again):  # parked again if suspended again
            self._host.parked(self._core)
            self._core.block_until(lambda: not self._core.suspend_requested, None, parking=True)
            self._unpark()
            again = True

    def spawn(self, spec: SpawnSpec | None = None, /, **fields: Any) -> SpawnedLike:
        """Spawn a child (a ``SpawnSpec`` or its fields as keywords).

        Returns the child's id or an ``ErrorInfo`` (never raises for a refused
        spawn); ``RejectedInputError`` (naming the field) for a malformed spec.
        """
        spec = make_spec(spec, **fields)
        self._checkpoint("spawn")
        spawned = self._host.spawn(self._core, spec)
        self._remember([spec], [spawned])
        return spawned

    def spawn_many(self, specs: Iterable[SpawnSpec]) -> list[SpawnedLike]:
        """Spawn a batch of children in one request to the supervisor (their
        records share one commit): one answer per spec, in order, each as
        ``spawn`` answers. ``RejectedInputError`` naming ``specs[i]`` for an
        item that is not a ``SpawnSpec``."""
        batch = spawn_batch(specs)
        self._checkpoint("spawn")
        answers = list(self._host.spawn_many(self._core, batch))
        self._remember(batch, answers)
        return answers

    def _wait_for(self, ready: Callable[[], bool], timeout: float | None) -> None:
        """Checkpoint, then block until ``ready()`` or the timeout; the caller looks.

        A suspension parks the skill and the wait goes on after resume.
        """
        core = self._core
        deadline = None if timeout is None else core.clock.monotonic() + timeout
        again = False
        while True:
            self._checkpoint("checkpoint", again)
            again = True
            if ready():
                return
            remaining = None if deadline is None else deadline - core.clock.monotonic()
            if remaining is not None and remaining <= 0:
                return
            core.block_until(ready, remaining)

    def wait(self, child: uuid.UUID, timeout: float | None = None) -> SessionResult | None:
        """Wait for one child's result; ``None`` if ``timeout`` (clock seconds) passes first."""
        core = self._core
        self._wait_for(lambda: child in core.unclaimed, timeout)
        with core.cond:
            result = self._claim(child)
        if core.tape is not None:
            self._taped([Collected(session_id=child, result=result, timed_out=result is None)])
        return result

    def collect(
        self,
        children: Iterable[uuid.UUID] | None = None,
        timeout: float | None = None,
        *,
        quorum: int | None = None,
        aggregate: str | None = None,
    ) -> list[Collected]:
        """Wait for the given children (default: those this run spawned and has not
        taken a result of yet) and take their results.

        Entries come in completion order; a child still running at the timeout
        gives a ``timed_out`` entry and keeps running. ``quorum``: stop waiting
        once that many have succeeded (with ``aggregate="vote"``: that many
        agree, or the leading answer can no longer be overtaken), or at once
        when too many have failed for it to be met (then none is
        ``counted``); the rest are cancelled with the node's grace and waited
        for (``superseded`` entries, with what they returned in it; one that
        never returns ends at the grace, terminated by force), and the
        entries that met it are ``counted``. ``RejectedInputError`` naming ``quorum`` for one that
        is not an integer from 1 to the number of children.
        """
        wanted = self._wanted(children)
        if quorum is not None:
            call = QuorumCollect(wanted, quorum, timeout, aggregate)
            return cast("list[Collected]", self._host.run_pattern(self, call))
        self._wait_for(lambda: self._claim_ready(wanted), timeout)
        return self._collected(wanted)

    def next_result(
        self, children: Iterable[uuid.UUID] | None = None, timeout: float | None = None
    ) -> Collected | None:
        """Wait for the first of ``children`` (default: every child of this run not
        yet taken) to end and take its result; None if ``timeout`` passes first
        or there is nothing to wait for."""
        wanted = self._wanted(children)
        if not wanted:
            return None
        self._wait_for(lambda: self._first_arrived(wanted) is not None, timeout)
        return self._take_first(wanted)

    def next_results(
        self, children: Iterable[uuid.UUID] | None = None, timeout: float | None = None
    ) -> list[Collected]:
        """``next_result``, taking every one of ``children`` whose result has
        arrived by then (in arrival order): children that end together cost one
        wait. Empty if ``timeout`` passes first or there is nothing to wait for."""
        wanted = self._wanted(children)
        if not wanted:
            return []
        self._wait_for(lambda: self._first_arrived(wanted) is not None, timeout)
        return self._take_arrived(wanted)

    def collect_from_children(
        self, timeout: float | None = None, children: Iterable[uuid.UUID] | None = None
    ) -> Iterator[Collected]:
        """Results in completion order, as they arrive; at ``timeout`` (clock
        seconds, for the whole iteration) each child still running yields a
        ``timed_out`` entry and keeps running (cancel it with ``cancel_child``).
        ``collect`` gives them all at once."""
        wanted = self._wanted(children)
        deadline = None if timeout is None else self._core.clock.monotonic() + timeout
        while wanted:
            left = None if deadline is None else max(0.0, deadline - self._core.clock.monotonic())
            got = self.next_result(wanted, left)
            if got is None:
                for child in wanted:
                    yield Collected(session_id=child, result=None, timed_out=True)
                return
            wanted.remove(got.session_id)
            yield got

    def cancel_child(self, child: uuid.UUID) -> ErrorInfo | None:
        """Cancel a child of this run and its subtree (grace, then force); None when accepted."""
        self._checkpoint("cancel_child")
        self._check_child(child)
        if self._core.tape is not None:
            self._core.tape.cancelled_child(child)
        return self._host.cancel(self._core, child)

    def send_to_parent(self, message: Any) -> None:
        """Hand ``message`` (a JSON value) to the parent, which reads it with
        ``updates()`` — progress during a run. Siblings never message each
        other: to reach them, write shared memory (``broadcast``)."""
        self._checkpoint("send_to_parent")
        self._host.send_to_parent(self._core, as_json("message", message))

    def broadcast(self, key: str, value: Any) -> str:
        """Share ``value`` with siblings as a shared-memory write (they read it
        with ``memory_get``); returns its memory id. There is no message between
        siblings: the tree routes everything through the parent or shared
        memory, so no session depends on a sibling being alive."""
        return self.memory_put(key, value)

    def fan_out(self, tasks: Iterable[Any], **options: Unpack[FanOutOptions]) -> Gathered:
        """One child per task, as many at once as the children limit allows
        (the rest queue); see ``sessiontree.supervision.fan_out`` for options."""
        return cast("Gathered", self._host.run_pattern(self, FanOut(list(tasks), options)))

    def pipeline(self, stages: Iterable[Any], **options: Unpack[PipelineOptions]) -> Gathered:
        """Stages in order, each a task or a list run in parallel, each seeded
        with the previous stage's results; see ``sessiontree.supervision.pipeline``."""
        return cast("Gathered", self._host.run_pattern(self, Pipeline(list(stages), options)))

    def map_reduce(
        self,
        items: Iterable[Any],
        map_task: Any,
        reduce_task: Any,
        **options: Unpack[MapReduceOptions],
    ) -> Gathered:
        """Map batches of ``items`` in parallel, then reduce their results; see
        ``sessiontree.supervision.map_reduce``."""
        call = MapReduce(list(items), map_task, reduce_task, options)
        return cast("Gathered", self._host.run_pattern(self, call))

    def continue_run(
        self, token: str, context: str, **options: Unpack[ContinueOptions]
    ) -> Gathered:
        """Continue an earlier run: a fresh session seeded from its continuation
        ``token`` and the explicit ``context`` (nothing else carries over)."""
        call = ContinueRun(token, context, options)
        return cast("Gathered", self._host.run_pattern(self, call))

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on the session's clock (a checkpoint before and after).

        A cancellation interrupts the wait at once (``Cancelled``); a suspension
        parks the skill and the wait goes on after resume.
        """
        self._wait_for(never, seconds)
        self._checkpoint("checkpoint", again=True)

    def memory_put(self, key: str, value: Any) -> str:
        """Write shared memory; returns a memory id for ``Outcome.memory_ids``.

        Raises ``NotAllowedError`` for workers (they never write memory).
        """
        self._checkpoint("memory_put")
        self._check_memory_write()
        return self._host.memory_put(self._core, key, value)

    def memory_get(self, key: str) -> Any:
        """Read shared memory; ``KeyError`` when the key is absent."""
        self._checkpoint("memory_get")
        return self._host.memory_get(self._core, key)

    def progress(self, note: str = "", **data: Any) -> None:
        """Report progress (an event; an expired session's result carries the last one)."""
        self._checkpoint("progress")
        self._host.progress(self._core, note, data)

    def complete(
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
        """Call the agent's chat model and return its reply (a ``Completion``).

        Sends the session's context (system prompt and ``context_summary``,
        then its messages) followed by ``prompt`` as a user message, or
        exactly ``messages`` when given; ``options`` go to the SDK as they are
        (``tools``, ``tool_choice``, ``response_format``, ``temperature``…).
        The model is the one the agent maps the session's tier to (``model``
        overrides it). ``max_tokens`` is capped to what the budgets leave.
        With ``stream``, text reaches the session's progress as it arrives.
        ``record`` (default: when ``messages`` is not given) appends the
        prompt and the reply to the context.

        A checkpoint while it waits: a cancellation raises ``Cancelled`` and
        closes the request; a suspension parks the skill (the call goes on).
        One exception: when a budget runs out, a call already in flight
        finishes and its reply is delivered (the next checkpoint raises
        ``Cancelled``), unless the grace ends first.
        A call the budgets refuse, or the provider fails after its retries,
        answers with ``error`` set (``budget_exhausted``, ``model_error``…),
        never by raising; ``RejectedInputError`` names a bad argument. On a
        Branch's context branch the exchange is recorded durably: a failed
        store write raises ``StoreError`` after the reply came (the call was
        made and is counted).
        """
        linked = self._linked() if messages is None or record else None
        history = linked if messages is None else None
        args = (prompt, messages, max_tokens, model, stream)
        call = model_call(self._core, *args, dict(options), history)  # checked first
        if history is not None and history.compact_due:
            self._compact(history)
            call = model_call(self._core, *args, options, history)  # the shorter context
        self._checkpoint("complete")
        pending = self._host.model_call(self._core, call)
        self._wake_when_done(pending)
        core = self._core
        try:
            while True:
                lands = landing(core)
                if not lands:
                    self._checkpoint("complete", again=True)
                if pending.done():
                    break
                core.block_until(pending.done, None, landing=lands)
        except BaseException:
            pending.cancel()  # closes the request; what it spent is still counted
            raise
        completion = pending.result()
        if record if record is not None else messages is None:
            said = exchanged(prompt, completion)
            if linked is None:
                self._core.context.messages.extend(said)
            elif said:
                linked.write(as_entries(said), usage_of(completion))
        if history is not None:
            self._note_length(history, completion)
        return completion

    def _compact(self, linked: LinkedContext) -> None:
        """Replace the context's oldest messages by one summary (see ``Compaction``)."""
        planned = self._compaction(linked)
        if planned is None:
            return
        rule, old, chat = planned
        text: str | None
        if rule.summarise is not None:
            text = rule.summarise(chat)
        else:
            text = self.complete(messages=summary_call(chat), record=False).text
        if text:
            linked.compact(text, old)

    def add_tool_result(self, tool_call_id: str, content: Any, name: str | None = None) -> None:
        """Append a tool's result for the tool call ``tool_call_id`` of the last
        reply to the context (the next ``complete`` sends it). Content that is
        not a string is sent as JSON text. ``RejectedInputError`` naming the
        field for a bad id or content."""
        self._add(tool_result(tool_call_id, content, name), "add_tool_result")

    def add_message(self, role: str, content: Any, name: str | None = None) -> None:
        """Append a message to this session's context: a Main's working context
        (persisted with it), a Branch's or Worker's context branch.

        Raises ``RejectedInputError`` (field ``content``) for content that is
        not a JSON value, so nothing unstorable enters the context (and, on a
        context branch, field ``role`` for a role other than user, assistant,
        system or tool).
        """
        self._add(context_message(role, content, name), "add_message")

    def _add(self, message: ContextMessage, what: str) -> None:
        self._checkpoint(what)
        linked = self._linked()
        if linked is None:
            self._core.context.messages.append(message)
        else:
            linked.write(as_entries([message]))
