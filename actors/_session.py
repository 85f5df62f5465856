"""The handles skill code receives: ``Session`` (sync) and ``AsyncSession``.

Every method here is a checkpoint: a pending cancellation raises
``Cancelled`` into the skill (once; afterwards the skill has the rest of the
grace period to wrap up and return a partial result), a pending suspension
parks the skill until it is resumed, and a fenced session (terminated by
force or expired) gets ``Cancelled`` every time.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any, Unpack, cast

import msgspec

from sessiontree.actors._clock import Clock
from sessiontree.actors._compaction import Compaction, summary_call
from sessiontree.actors._completing import as_entries, exchanged, model_call, tool_result
from sessiontree.actors._conversing import ConversationLike, LinkedContext
from sessiontree.actors._core import Cancelled, ContextMessage, SessionContext, SessionCore
from sessiontree.actors._host import SessionHost, SpawnedLike
from sessiontree.actors._tape import TapedClock
from sessiontree.protocol import (
    Collected,
    Completion,
    ContinueOptions,
    ContinueRun,
    ErrorCode,
    ErrorInfo,
    FanOut,
    FanOutOptions,
    Gathered,
    MapReduce,
    MapReduceOptions,
    Message,
    NotAllowedError,
    Pipeline,
    PipelineOptions,
    QuorumCollect,
    RejectedInputError,
    SessionInfo,
    SessionKind,
    SessionResult,
    SpawnSpec,
    as_json,
    make_spec,
    spawn_batch,
)

__all__ = ["AsyncSession", "Session"]


class _Base:
    """What both handles share: identity, context and the non-blocking checks."""

    def __init__(
        self, core: SessionCore, host: SessionHost, *, message: Any = None, cycle: int = 0
    ) -> None:
        self._core = core
        self._host = host
        self._spawned: dict[uuid.UUID, None] = {}  # in spawn order
        self._taken: set[uuid.UUID] = set()
        self._random: random.Random | None = None
        self.message = message
        """For a Main: the inbound message (or child ``SessionResult``) of this cycle."""
        self.cycle = cycle
        """For a Main: which message cycle this is (1, 2, …); 0 for branches and workers."""

    # -- identity (no checkpoint) ---------------------------------------------

    @property
    def info(self) -> SessionInfo:
        """This session's identity as it was spawned."""
        return self._core.info

    @property
    def session_id(self) -> uuid.UUID:
        return self._core.session_id

    @property
    def agent_id(self) -> str:
        return self._core.info.agent_id

    @property
    def kind(self) -> SessionKind:
        return self._core.info.kind

    @property
    def depth(self) -> int:
        return self._core.info.depth

    @property
    def task(self) -> str:
        return self._core.info.task

    @property
    def context_summary(self) -> str:
        return self._core.info.context_summary

    @property
    def input(self) -> Any:
        """The structured input the spawn carried (JSON data: dicts, lists, str,
        numbers, bools), or None; a branch resumed after a restart still has it."""
        return self._core.info.input

    @property
    def model_tier(self) -> str | None:
        return self._core.info.model_tier

    @property
    def clock(self) -> Clock:
        """The node's clock (``monotonic()`` for deadlines; tests advance a virtual
        one). In a recorded run its readings are recorded, and replayed."""
        core = self._core
        tape = core.tape
        return core.clock if tape is None else TapedClock(core.clock, tape)

    @property
    def random(self) -> random.Random:
        """This run's random numbers: draw them here (not from the ``random``
        module) and a recorded run replays with the same ones. Seeded from the
        system's entropy, or in a recorded run by a seed its tape keeps."""
        drawn = self._random
        if drawn is None:
            tape = self._core.tape
            seed = None if tape is None else tape.seed()
            drawn = self._random = random.Random(seed)  # noqa: S311 (a skill's, not secrets)
        return drawn

    @property
    def resumed(self) -> bool:
        """True when this run continues a suspended branch after a node restart."""
        return self._core.resumed

    @property
    def attempt(self) -> int:
        """Which run of this work this is: 1, or more when crashes of the node cut
        earlier runs off (a Main's cycle whose message is replayed after a
        restart, a branch run again after one). A skill whose effects live
        outside the store deduplicates them on it. In a Main's cycle on a node
        with a store, reading it waits until the cycle's start is on record (one
        commit at most), so a crash after the read counts against the input."""
        core = self._core
        if core.mark_durable is not None:
            core.mark_durable()
        return core.attempt

    @property
    def traceparent(self) -> str | None:
        """On a traced node, the W3C ``traceparent`` of this run's span (a Main's:
        its running cycle's), to hand to a service the skill calls; None on a
        node that is not traced. The span is also the current OpenTelemetry
        span while the skill runs."""
        return self._core.cycle_trace or self._core.info.trace

    @property
    def context(self) -> SessionContext:
        """The session's working context (messages, tool results, system prompt)."""
        return self._core.context

    @property
    def cancel_pending(self) -> bool:
        """True once cancellation was requested (not a checkpoint; never raises)."""
        return self._core.cancel_code is not None or self._core.fenced

    @property
    def cancel_reason(self) -> ErrorCode | None:
        """Why cancellation was requested, if it was."""
        return self._core.cancel_code

    @property
    def children(self) -> tuple[uuid.UUID, ...]:
        """Children this run spawned, in order."""
        return tuple(self._spawned)

    @property
    def conversation(self) -> ConversationLike:
        """This session's conversation tree (``append``, ``fork``, ``context``…).

        A Main's is the conversation of its session key. A Branch's or
        Worker's is its own branch of its root Main's conversation, forked
        where its spawn said (``SpawnSpec.fork_at``): what ``complete`` sends
        and records, what ``add_message`` writes; a Branch's is durable, a
        Worker's lives in memory only. Every call on it is a checkpoint.
        Async skills await the write twins (``aappend``…); reads are local,
        and a read of a Main's context first waits (briefly, bounded) for the
        children's results being written to it.
        """
        return self._host.conversation(self._core, self._conversation_guard)

    def _linked(self) -> LinkedContext | None:
        """A spawned session's context branch (None for a Main)."""
        return self._host.linked_context(self._core, self._conversation_guard)

    def _compaction(
        self, linked: LinkedContext
    ) -> tuple[Compaction, list[Message], list[dict[str, Any]]] | None:
        """What a due compaction replaces: the agent's rule, the old messages and
        them as chat messages; None when there is nothing to replace."""
        linked.compact_due = False
        rule = self._host.compaction(self._core)
        old = [] if rule is None else linked.compactable(rule.keep)
        if rule is None or not old:
            return None
        return rule, old, [message.as_chat() for message in old]

    def _note_length(self, linked: LinkedContext, completion: Completion) -> None:
        """Mark the context for compaction before the next call when this one was long."""
        rule = self._host.compaction(self._core)
        if rule is not None and rule.due(completion):
            linked.compact_due = True

    def _conversation_guard(self, what: str) -> None:
        if self._raise_if_cancelled(what):  # a suspension parks at the next awaited checkpoint
            self._unpark()

    def results(self) -> list[SessionResult]:
        """Every child result this session has received so far (not a checkpoint)."""
        with self._core.cond:
            return list(self._core.received)

    # -- checkpoint logic -------------------------------------------------------

    def _raise_if_cancelled(self, what: str = "checkpoint", again: bool = False) -> bool:
        """Raise ``Cancelled`` if due; return True if a suspension is pending.

        A fenced session's call (``what``) is refused and counted every time.
        ``again``: the same call checks again (it waited), so a recorded run's
        tape counts it once.
        """
        core = self._core
        core.touch()
        tape = core.tape
        if tape is not None:
            tape.checkpoint(again)
        fence_code = core.fence_code
        if fence_code is None and core.release_code is not None:  # the node closes
            core.fence(core.release_code)
            fence_code = core.fence_code
        if fence_code is not None:
            self._host.refused(core, what)
            if tape is not None:
                tape.interrupted(fence_code, fenced=True)
            raise Cancelled(fence_code, core.session_id)
        with core.cond:
            code = core.cancel_code
            if code is None:
                if core.suspend_requested:
                    core.parked = True
                    return True
                return False
            if core.cancel_raised:
                return False
            core.cancel_raised = True
        if tape is not None:
            tape.interrupted(code, fenced=False)
        raise Cancelled(code, core.session_id)  # raised with the lock released

    def _unpark(self) -> None:
        with self._core.cond:
            self._core.parked = False

    def _claim(self, child: uuid.UUID) -> SessionResult | None:
        """Take a child's result (call with ``cond`` held); the run will not wait on it again."""
        result = self._core.claim(child)
        if result is not None:
            self._taken.add(child)
        return result

    def _taped(self, taken: list[Collected]) -> list[Collected]:
        """``taken`` (a take's entries), told to a recorded run's tape (call
        only when there is one)."""
        tape = self._core.tape
        assert tape is not None
        tape.took([c.session_id for c in taken if c.result is not None])
        return taken

    def _claim_ready(self, wanted: Sequence[uuid.UUID]) -> bool:
        return all(c in self._core.unclaimed for c in wanted)

    def _collected(self, wanted: Sequence[uuid.UUID]) -> list[Collected]:
        core = self._core
        done: list[Collected] = []
        with core.cond:
            arrived = {r.session_id: i for i, r in enumerate(core.unclaimed.values())}
            order = sorted(wanted, key=lambda c: arrived.get(c, len(arrived)))
            for child in order:
                result = self._claim(child)
                done.append(Collected(session_id=child, result=result, timed_out=result is None))
        return done if core.tape is None else self._taped(done)

    def _remember(self, specs: Sequence[SpawnSpec], answers: list[SpawnedLike]) -> None:
        """Note the children a spawn call made (and tell a recorded run's tape)."""
        for spawned in answers:
            if spawned.session_id is not None:
                self._spawned[spawned.session_id] = None
        tape = self._core.tape
        if tape is not None:
            tape.spawned(specs, [a.session_id for a in answers], [a.error for a in answers])

    def _wanted(self, children: Iterable[uuid.UUID] | None) -> list[uuid.UUID]:
        if children is None:  # every child of this run whose result it has not taken
            return [c for c in self._spawned if c not in self._taken]
        return list(children)

    def updates(self) -> list[tuple[uuid.UUID, Any]]:
        """Messages children sent with ``send_to_parent`` since the last call,
        oldest first, as (child id, message); taken (not a checkpoint)."""
        with self._core.cond:
            taken = list(self._core.updates)
            self._core.updates.clear()
        return taken

    def _first_arrived(self, wanted: Sequence[uuid.UUID]) -> uuid.UUID | None:
        """Of ``wanted``, the child whose result arrived first (call with ``cond`` held)."""
        wanted_set = set(wanted)
        return next((c for c in self._core.unclaimed if c in wanted_set), None)

    def _take_arrived(self, wanted: Sequence[uuid.UUID]) -> list[Collected]:
        with self._core.cond:
            wanted_set = set(wanted)
            arrived = [c for c in self._core.unclaimed if c in wanted_set]
            taken = [
                Collected(session_id=c, result=self._claim(c), timed_out=False) for c in arrived
            ]
        return taken if self._core.tape is None else self._taped(taken)

    def _take_first(self, wanted: Sequence[uuid.UUID]) -> Collected | None:
        with self._core.cond:
            child = self._first_arrived(wanted)
            got = None
            if child is not None:
                got = Collected(session_id=child, result=self._claim(child), timed_out=False)
        if self._core.tape is not None:
            self._taped([] if got is None else [got])
        return got

    def _check_child(self, child: uuid.UUID) -> None:
        if child not in self._spawned:
            msg = f"session {child} is not a child this run of {self.session_id} spawned"
            raise NotAllowedError(msg, session_id=self.session_id)

    def _wake_when_done(self, future: Any) -> None:
        """Have ``future``'s completion wake the skill where it waits."""
        core = self._core

        def wake(_done: Any) -> None:
            with core.cond:
                core.wake()

        future.add_done_callback(wake)

    def _check_memory_write(self) -> None:
        if self.kind is SessionKind.WORKER:
            msg = f"worker session {self.session_id} may not write shared memory"
            raise NotAllowedError(msg, session_id=self.session_id)


class Session(_Base):
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
        self._wait_for(_never, seconds)
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
                landing = _landing(core)
                if not landing:
                    self._checkpoint("complete", again=True)
                if pending.done():
                    break
                core.block_until(pending.done, None, landing=landing)
        except BaseException:
            pending.cancel()  # closes the request; what it spent is still counted
            raise
        completion = pending.result()
        if record if record is not None else messages is None:
            said = exchanged(prompt, completion)
            if linked is None:
                self._core.context.messages.extend(said)
            elif said:
                linked.write(as_entries(said), _usage_of(completion))
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
        self._add(_message(role, content, name), "add_message")

    def _add(self, message: ContextMessage, what: str) -> None:
        self._checkpoint(what)
        linked = self._linked()
        if linked is None:
            self._core.context.messages.append(message)
        else:
            linked.write(as_entries([message]))


class AsyncSession(_Base):
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
        await self._wait_for(_never, seconds)
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
                landing = _landing(core)
                if not landing:
                    await self._checkpoint("complete", again=True)
                if pending.done():
                    break
                await core.block_until_async(pending.done, None, landing=landing)
        except BaseException:
            pending.cancel()
            raise
        completion = pending.result()
        if record if record is not None else messages is None:
            said = exchanged(prompt, completion)
            if linked is None:
                self._core.context.messages.extend(said)
            elif said:
                await linked.awrite(as_entries(said), _usage_of(completion))
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
        await self._add(_message(role, content, name), "add_message")

    async def _add(self, message: ContextMessage, what: str) -> None:
        await self._checkpoint(what)
        linked = self._linked()
        if linked is None:
            self._core.context.messages.append(message)
        else:
            await linked.awrite(as_entries([message]))


def _message(role: str, content: Any, name: str | None) -> ContextMessage:
    if not isinstance(role, str) or not role:
        msg = f"a context message needs a role string, got {role!r}"
        raise RejectedInputError(msg, field="role")
    try:
        content = msgspec.json.decode(msgspec.json.encode(content))  # a plain JSON copy
    except (TypeError, msgspec.EncodeError) as exc:
        msg = f"context message content must be a JSON value: {exc}"
        raise RejectedInputError(msg, field="content") from exc
    return ContextMessage(role, content, name)


def _usage_of(completion: Completion) -> dict[str, Any]:
    """A reply's usage as its context message records it."""
    return msgspec.structs.asdict(completion.usage)


def _landing(core: SessionCore) -> bool:
    """Whether a model call in flight finishes and its reply is delivered
    although the session was cancelled: when its budget ran out (the next
    checkpoint raises ``Cancelled``), unless the session is fenced or let go."""
    return core.cancel_code is ErrorCode.BUDGET_EXHAUSTED and not core.letting_go


def _never() -> bool:
    """What a plain sleep waits for: nothing but its timeout (or an interrupt)."""
    return False
