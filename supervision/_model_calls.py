"""A session's model call on the node: reserve, send, settle (issue 20).

Every call runs on the node's event loop. Its worst case (the prompt,
estimated conservatively, plus ``max_tokens``) is reserved against the
session and every ancestor in one turn of the Cortex, and on a node with a
store written down (a ``CallRecord``) before the request leaves; a call that
cannot fit is answered with ``budget_exhausted`` and never sent. The call goes out with
``max_tokens`` capped to what the budgets leave, and when it ends its
reservation is settled to the usage the provider reported, priced, and
written to the store before the reply reaches the skill (on a node without
a store nothing is durable, so the settle is told and not waited for; the
Cortex takes it before anything the session asks next, one mailbox in order):

- a reply with usage counts exactly that;
- a reply without usage keeps its text, is answered with ``model_error``
  (field ``usage``) and counts its worst case, so budgets still hold;
- a failed call (after its retries) counts one call and no tokens;
- a cancelled call counts its worst case as reserved (the provider reported
  nothing, and may have charged for what it generated before the request
  was closed): its prompt as estimated and the completion tokens it was
  allowed, which is none when nothing bounded ``max_tokens``;
- a call lost with its node (in flight at a crash) is counted the same way
  when the node comes back (``settle_lost_calls`` in ``_recovery``).

A call settles wherever it lands: in its session's and every ancestor's
accounts, ended ones included (see ``Ledgers.settle``).

Streamed text goes to the session's progress as it arrives; the pieces of
every stream that arrive in one pass of the loop reach the Cortex as one
message, and a call's pieces before its settle.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, cast

import msgspec

from sessiontree.actors.runtime import Activity, ModelCall, SessionCore
from sessiontree.protocol import Completion, ErrorCode, ErrorInfo, NodeClosedError, Usage
from sessiontree.supervision._call_hold import HOLD, CallHold
from sessiontree.supervision._config import Agent
from sessiontree.supervision._ledger import Reserve, Reserved, Settle, priced
from sessiontree.supervision._models import Models, Reply, Route
from sessiontree.supervision._reports import Streamed
from sessiontree.supervision._requests import Call, Request

if TYPE_CHECKING:
    from sessiontree.supervision._recording import SessionTape

__all__ = ["ModelCalls", "Spent", "estimate_tokens"]

_ENCODE = msgspec.json.Encoder().encode

#: What each call is tallied by, for the metrics: (agent, model, tier).
Spent = tuple[str, str, str]


def estimate_tokens(call: ModelCall) -> int:
    """A conservative estimate of the prompt's tokens: half a token per byte
    of the messages (and tools) as JSON, and 4 per message. Real tokenizers
    average about 4 bytes a token, so it over-reserves; settling corrects it."""
    size = len(_ENCODE(call.messages))
    tools = call.options.get("tools")
    if tools:
        size += len(_ENCODE(tools))
    return size // 2 + 4 * len(call.messages)


class ModelCalls:
    """Model calls for the sessions of one node (on its event loop)."""

    def __init__(
        self,
        models: Models,
        agents: Mapping[str, Agent],
        ask: Callable[[Request[Any]], Awaitable[Any]],
        tell: Callable[[object], None],
        activity: Activity,
        loop: Callable[[], asyncio.AbstractEventLoop],
        *,
        durable: bool,
        clock: Callable[[], float] | None = None,
        capture_content: bool = False,
    ) -> None:
        """``ask`` a request of the Cortex and await its answer (``NodeClosedError``
        once the node closes), ``tell`` it a message; ``activity`` counts
        progress not yet told; ``loop`` is the node's event loop (made on
        first use); ``durable``: the node has a store, so a call waits until
        its usage is written; ``clock``: on a traced node, the wall clock each
        call's span is timed by (its content recorded with ``capture_content``)."""
        self.models = models
        self.clock = clock
        self.capture_content = capture_content
        self.agents = agents
        self.ask = ask
        self.tell = tell
        self.activity = activity
        self.loop = loop
        self.durable = durable
        self._deltas: list[tuple[uuid.UUID, str]] = []  # on the event loop thread only
        self._closing: set[asyncio.Future[Completion]] = set()  # hedged requests cancelled
        self._tallies: collections.defaultdict[tuple[Spent, str], float] = collections.defaultdict(
            float
        )
        self._lock = threading.Lock()  # the metrics read the tallies from their thread

    def start(self, core: SessionCore, call: ModelCall) -> concurrent.futures.Future[Completion]:
        """Start ``call`` on the node's loop from a skill thread."""
        work, hold = self._work(core, call)
        started = asyncio.run_coroutine_threadsafe(work, self.loop())
        if hold is not None:
            started.add_done_callback(hold.close)
        return started

    def start_here(self, core: SessionCore, call: ModelCall) -> asyncio.Future[Completion]:
        """Start ``call`` on the running loop (an async skill's)."""
        work, hold = self._work(core, call)
        started = asyncio.ensure_future(work)
        if hold is not None:
            started.add_done_callback(hold.close)
        return started

    def _work(
        self, core: SessionCore, call: ModelCall
    ) -> tuple[Coroutine[Any, Any, Completion], CallHold | None]:
        """The coroutine that makes ``call``, and in a replay the hold it runs
        under (let go once it ends)."""
        if core.tape is not None and core.tape.replaying:
            hold = CallHold(self.activity)
            return self._held(core, call, hold), hold
        return self.complete(core, call), None

    async def _held(self, core: SessionCore, call: ModelCall, hold: CallHold) -> Completion:
        """``complete`` in a replay: the call counts as running (its ``hold``)
        until it ends, but while it waits out its recorded latency, so the
        replay's clock moves only when nothing runs (``PlayTape._idle``)."""
        HOLD.set(hold)  # this task's context: the tape's model finds it there
        return await self.complete(core, call)

    async def complete(self, core: SessionCore, call: ModelCall) -> Completion:
        """Reserve, send and settle one call (a hedged one: see ``_hedged``);
        the reply, or why there is none."""
        if call.hedge_after is not None:
            return await self._hedged(core, call, call.hedge_after)
        return await self._one(core, call)

    async def _hedged(self, core: SessionCore, call: ModelCall, after: float) -> Completion:
        """A call with a duplicate: if the first has not answered ``after`` clock
        seconds, the same request goes out again (reserved and counted as a
        call of its own: the budgets hold; one they cannot fit is not sent,
        and stops nothing); the first reply without an error is the answer, a
        failed one waits for the other, and the request still out is
        cancelled (settled as a cancelled call) before the answer returns, so
        both requests are in the session's own usage by then."""
        loop = asyncio.get_running_loop()
        due: asyncio.Future[None] = loop.create_future()

        def fire() -> None:  # on the clock's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_resolve, due)

        first = asyncio.ensure_future(self._one(core, call))
        timer = core.clock.call_later(after, fire)
        calls = {first}
        try:
            first_or_due: set[asyncio.Future[Any]] = {first, due}
            await asyncio.wait(first_or_due, return_when=asyncio.FIRST_COMPLETED)
            timer.cancel()
            if not first.done():
                calls.add(asyncio.ensure_future(self._one(core, call, optional=True)))
            answered: Completion | None = None
            pending = set(calls)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    completion = task.result()
                    if answered is None or answered.error is not None:
                        answered = completion
                if answered is not None and answered.error is None:
                    break
            assert answered is not None  # a task ended, or the loop went on
        finally:
            timer.cancel()
            slower = [task for task in calls if not task.done()]
            for task in slower:  # the slower request: closed, settled as cancelled
                task.cancel()
                self._closing.add(task)  # held until it has settled (the loop holds
                task.add_done_callback(self._closing.discard)  # tasks weakly)
        if slower:  # its settle is told once it ends: wait for that, not for the store
            await asyncio.wait(slower)
        return answered

    async def _one(
        self, core: SessionCore, call: ModelCall, *, optional: bool = False
    ) -> Completion:
        """Reserve, send and settle one request (``optional``: a hedge's
        duplicate, see ``Ledgers.reserve``)."""
        agent = self.agents[core.info.agent_id]
        route = self.models.route(agent, core.info.model_tier, call.model)
        if isinstance(route, ErrorInfo):
            return Completion(error=route)
        estimate = estimate_tokens(call)
        reserve = Reserve(core.session_id, estimate, call.max_tokens, route.price, optional)
        asked = asyncio.ensure_future(self.ask(reserve))
        try:
            held = await asyncio.shield(asked)
        except NodeClosedError as exc:
            return Completion(model=route.model, error=exc.to_info())
        except asyncio.CancelledError:  # the Cortex may still grant it: then release it
            asked.add_done_callback(self._release)
            raise
        if isinstance(held, ErrorInfo):
            return Completion(model=route.model, error=held)
        request: dict[str, Any] = dict(call.options, messages=list(call.messages))
        if held.max_tokens is not None:
            request["max_tokens"] = held.max_tokens
        on_delta = functools.partial(self._delta, core) if call.stream else None
        clock = self.clock
        started = 0.0 if clock is None else clock()
        try:
            tape = cast("SessionTape | None", core.tape)
            if tape is None:
                reply = await self.models.call(route, request, on_delta)
            else:  # a recorded run's reply is taped (a replay's comes off its tape)
                send = functools.partial(self.models.call, route, request)
                reply = await tape.model(route.model, request, on_delta, send)
        except BaseException:  # cancelled (the request is closed): settled all the same
            cut = held.ask  # its worst case: what it generated before the close is unknown
            self._tally(core, route, cut, None)  # the metrics count what the budgets do
            self._flush_deltas()
            traced = None
            if clock is not None:
                traced = self._span(core, call, route, started, None, cut)
                traced["error"] = ErrorCode.CANCELLED.value
            self.tell(Call(Settle(held, cut, traced)))
            raise
        self._flush_deltas()
        completion, used = _outcome(route, held, reply)
        self._tally(core, route, used, completion.error)
        traced = None if clock is None else self._span(core, call, route, started, completion, used)
        if not self.durable:
            self.tell(Call(Settle(held, used, traced)))  # nothing to wait for (see the docstring)
            return completion
        try:
            refused = await self.ask(Settle(held, used, traced))
        except NodeClosedError as exc:
            refused = exc.to_info()
        if refused is not None and completion.error is None:
            return msgspec.structs.replace(completion, error=refused)
        return completion

    def _span(
        self,
        core: SessionCore,
        call: ModelCall,
        route: Route,
        started: float,
        completion: Completion | None,
        used: Usage,
    ) -> dict[str, Any]:
        """What the call's span records (``MODEL_CALL``'s data): it is a child
        of the session's span (a Main's: its running cycle's)."""
        assert self.clock is not None
        span: dict[str, Any] = {
            "trace": core.cycle_trace or core.info.trace,
            "model": route.model,
            "provider": route.provider.name,
            "started_at": started,
            "ended_at": self.clock(),
            "stream": call.stream,
            "input_tokens": used.prompt_tokens,
            "output_tokens": used.completion_tokens,
            "cost": used.cost,
        }
        if completion is not None:
            span.update(
                response_model=completion.model,
                max_tokens=completion.max_tokens,
                finish_reason=completion.finish_reason,
            )
            if completion.error is not None:
                span["error"] = completion.error.code.value
            if self.capture_content:
                span["prompt"] = _ENCODE(call.messages).decode()
                span["reply"] = completion.text
        return span

    def _release(self, asked: asyncio.Future[Reserved | ErrorInfo]) -> None:
        """A reservation granted after its call was cancelled: settled unused."""
        if asked.cancelled() or asked.exception() is not None:
            return
        held = asked.result()
        if isinstance(held, Reserved):
            self.tell(Call(Settle(held, Usage())))

    def _delta(self, core: SessionCore, text: str) -> None:
        """A piece of streamed text for the session's progress, told with the
        rest of this pass of the loop: a hand-off to the Cortex thread per
        piece was most of what a stream through a session cost."""
        deltas = self._deltas
        deltas.append((core.session_id, text))
        if len(deltas) == 1:
            self.activity.begin()  # counted until told
            self.loop().call_soon(self._flush_deltas)

    def _flush_deltas(self) -> None:
        """Tell the Cortex the pieces of text gathered so far (on the loop)."""
        if not self._deltas:
            return
        batch, self._deltas = self._deltas, []
        self.tell(Streamed(tuple(batch)))
        self.activity.end()

    def _tally(self, core: SessionCore, route: Route, used: Usage, error: ErrorInfo | None) -> None:
        key: Spent = (core.info.agent_id, route.model, core.info.model_tier or "")
        with self._lock:
            tallies = self._tallies
            tallies[key, "calls"] += 1
            tallies[key, "prompt_tokens"] += used.prompt_tokens
            tallies[key, "completion_tokens"] += used.completion_tokens
            tallies[key, "cost"] += used.cost
            if error is not None:
                tallies[key, "errors"] += 1

    def tallies(self) -> dict[tuple[Spent, str], float]:
        """Every call's figures so far by (agent, model, tier) and figure:
        ``calls``, ``errors``, ``prompt_tokens``, ``completion_tokens``, ``cost``."""
        with self._lock:
            return dict(self._tallies)


def _resolve(due: asyncio.Future[None]) -> None:
    if not due.done():
        due.set_result(None)


def _outcome(route: Route, held: Reserved, reply: Reply | ErrorInfo) -> tuple[Completion, Usage]:
    """The skill's answer and what the call counts (see the module docstring)."""
    if isinstance(reply, ErrorInfo):
        used = priced(Usage(calls=1), route.price)
        return Completion(model=route.model, max_tokens=held.max_tokens, error=reply), used
    error = None
    if reply.usage is None:
        used = held.ask
        error = ErrorInfo(
            code=ErrorCode.MODEL_ERROR,
            message=f"model {route.model!r} replied without usage; counted at its worst case",
            detail={"field": "usage", "provider": route.provider.name},
        )
    else:
        prompt, completion_tokens = reply.usage
        used = priced(
            Usage(prompt_tokens=prompt, completion_tokens=completion_tokens, calls=1), route.price
        )
    completion = Completion(
        text=reply.text,
        tool_calls=reply.tool_calls,
        finish_reason=reply.finish_reason,
        model=reply.model or route.model,
        usage=used,
        max_tokens=held.max_tokens,
        error=error,
    )
    return completion, used
