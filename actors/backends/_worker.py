"""The worker's side of a remote step: the handle a skill gets, and running it.

A remote step is a leaf: it reads its identity and inputs, reports progress,
sends to its parent, calls models and honours cancellation at
``checkpoint()``; spawning, shared memory and conversations stay with inline
sessions (their state is the node's store, which remote steps never write).
What runs here is pickled to the worker, so it holds nothing of the node.

A model call goes through the node, so budgets, reservations and usage hold
for remote steps exactly as for inline ones: the step sends the call as an
event and waits for the node's answer (:meth:`StepControl.answer`), taking a
cancellation while it waits like any checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import os
import pickle
import threading
import uuid
from collections.abc import Callable
from typing import Any

from sessiontree.actors._completing import model_call, record_exchange, tool_result
from sessiontree.actors._context import SessionContext
from sessiontree.actors._core import Cancelled
from sessiontree.actors._execution import crash_info, to_outcome
from sessiontree.actors._trace_scope import enter_span, leave_span
from sessiontree.actors.backends._calls import decode_completion, encode_call
from sessiontree.actors.backends._protocol import StepEnd, StepEvent, StepJob
from sessiontree.protocol import (
    Completion,
    ErrorCode,
    ErrorInfo,
    NotAllowedError,
    SessionInfo,
    SessionKind,
    as_json,
)

__all__ = [
    "AsyncRemoteSession",
    "RemoteSession",
    "StepControl",
    "execute_step",
    "worker_facts",
]


class Awaited:
    """A model call a step waits on: the node's answer (an encoded
    ``Completion``) once it came. ``wake`` runs on the thread that delivered
    it (or a cancel), so a waiter on an event loop sets ``waker``."""

    __slots__ = ("answer", "waker", "woken")

    def __init__(self) -> None:
        self.answer: bytes | None = None
        self.woken = threading.Event()
        self.waker: Callable[[], None] | None = None

    def wake(self) -> None:
        self.woken.set()
        waker = self.waker
        if waker is not None:
            waker()


class StepControl:
    """A running step's cancellation state and the answers to its model calls,
    set from the worker's control channel (any thread)."""

    def __init__(self, job_id: int, code: ErrorCode | None = None) -> None:
        self.job_id = job_id
        self.code = code
        self.raised = False
        self.changed = threading.Event()
        if code is not None:
            self.changed.set()
        self._lock = threading.Lock()
        self._calls: dict[int, Awaited] = {}
        self._call_ids = itertools.count(1)

    def cancel(self, code: ErrorCode) -> None:
        if self.code is None:
            self.code = code
        self.changed.set()
        with self._lock:
            waiting = list(self._calls.values())
        for call in waiting:
            call.wake()

    def expect(self) -> tuple[int, Awaited]:
        """A new model call's id, and where its answer will land."""
        awaited = Awaited()
        with self._lock:
            call_id = next(self._call_ids)
            self._calls[call_id] = awaited
        return call_id, awaited

    def answer(self, call_id: int, data: bytes) -> None:
        """The node answered call ``call_id`` (dropped if nobody waits on it)."""
        with self._lock:
            awaited = self._calls.get(call_id)
        if awaited is not None:
            awaited.answer = data
            awaited.wake()

    def forget(self, call_id: int) -> None:
        """Call ``call_id`` is answered or abandoned: nothing more lands for it."""
        with self._lock:
            self._calls.pop(call_id, None)


class RemoteSession:
    """The handle a skill gets in a worker: identity, inputs, ``checkpoint()``,
    ``progress``, ``send_to_parent``, ``sleep``, and model calls
    (``complete``, ``add_tool_result``) made through the node. It is made for
    one step and dropped after it, so nothing of one session reaches the next
    on the same worker. Everything else that needs the node (spawn, collect,
    memory, conversations) raises ``NotAllowedError`` naming the method and
    backend.
    """

    def __init__(
        self, job: StepJob, control: StepControl, emit: Callable[[StepEvent], None]
    ) -> None:
        self._job = job
        self._control = control
        self._emit = emit
        self.context = SessionContext()
        """This step's working context (empty at the start of every session)."""
        self.message: Any = None
        self.cycle = 0

    # -- identity -------------------------------------------------------------------

    @property
    def info(self) -> SessionInfo:
        return self._job.info

    @property
    def session_id(self) -> uuid.UUID:
        return self._job.info.session_id

    @property
    def agent_id(self) -> str:
        return self._job.info.agent_id

    @property
    def kind(self) -> SessionKind:
        return self._job.info.kind

    @property
    def depth(self) -> int:
        return self._job.info.depth

    @property
    def task(self) -> str:
        return self._job.info.task

    @property
    def context_summary(self) -> str:
        return self._job.info.context_summary

    @property
    def input(self) -> Any:
        """The structured input the spawn carried (JSON data), or None."""
        return self._job.info.input

    @property
    def model_tier(self) -> str | None:
        return self._job.info.model_tier

    @property
    def metadata(self) -> dict[str, Any]:
        return self._job.info.metadata

    @property
    def backend(self) -> str:
        """Where this step runs (``process`` or ``ray``)."""
        return self._job.backend

    @property
    def resumed(self) -> bool:
        return False

    @property
    def attempt(self) -> int:
        return self._job.attempt

    @property
    def traceparent(self) -> str | None:
        """The session's span on a traced node (the current span while the step runs)."""
        return self._job.info.trace

    @property
    def cancel_pending(self) -> bool:
        """True once cancellation was requested (not a checkpoint; never raises)."""
        return self._control.code is not None

    @property
    def cancel_reason(self) -> ErrorCode | None:
        return self._control.code

    # -- checkpoints ------------------------------------------------------------------

    def _check(self) -> None:
        control = self._control
        if control.code is not None and not control.raised:
            control.raised = True  # once: the rest of the grace is the skill's to wrap up
            raise Cancelled(control.code, self.session_id)

    def checkpoint(self) -> None:
        """Raise ``Cancelled`` (once) if the session was asked to stop."""
        self._check()

    def progress(self, note: str = "", **data: Any) -> None:
        """Report progress to the node (an event; an expired session's result carries the last)."""
        self._check()
        self._emit(("progress", (str(note), as_json("progress", data))))

    def send_to_parent(self, message: Any) -> None:
        """Hand ``message`` (a JSON value) to the parent, which reads it with ``updates()``."""
        self._check()
        self._emit(("send", as_json("message", message)))

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (real time in the worker); a cancellation ends the wait at once."""
        self._check()
        self._control.changed.wait(max(0.0, seconds))
        self._check()

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
        """Call the agent's chat model through the node and return its reply.

        As ``Session.complete``: the same arguments, the same answers (a
        refused or failed call is a ``Completion`` with ``error`` set), and
        the node reserves, sends and settles it, so the session's budgets
        and usage hold as for an inline call. What is sent by default is this
        step's own ``context`` (its system prompt, the ``context_summary`` it
        was spawned with, what earlier calls of this step recorded) and the
        prompt. Streamed text reaches the session's progress on the node.

        A checkpoint while it waits: a cancellation raises ``Cancelled`` and
        the node closes the request (a budget running out lets a call in
        flight land first, as inline); a step killed mid-call has its request
        closed by the node. ``RejectedInputError`` names a bad argument.
        """
        call = model_call(self, prompt, messages, max_tokens, model, stream, options)
        data = encode_call(call)
        self._check()
        call_id, awaited = self._control.expect()
        try:
            self._emit(("complete", (call_id, data)))
            while True:
                awaited.woken.clear()  # before looking: a wake from now on is kept
                if not self._landing():
                    self._check()
                answer = awaited.answer
                if answer is not None:
                    break
                awaited.woken.wait()
        except BaseException:
            self._abandon(call_id)
            raise
        finally:
            self._control.forget(call_id)
        return self._answered(answer, prompt, messages, record)

    def add_tool_result(self, tool_call_id: str, content: Any, name: str | None = None) -> None:
        """Append a tool's result for the tool call ``tool_call_id`` of the last
        reply to this step's context (the next ``complete`` sends it); see
        ``Session.add_tool_result``."""
        self._check()
        self.context.messages.append(tool_result(tool_call_id, content, name))

    def _landing(self) -> bool:
        """Whether a call in flight lands although the step was cancelled: when
        its budget ran out (the next checkpoint raises ``Cancelled``)."""
        return self._control.code is ErrorCode.BUDGET_EXHAUSTED

    def _abandon(self, call_id: int) -> None:
        with contextlib.suppress(Exception):  # a node that is gone closes it anyway
            self._emit(("abandon", call_id))

    def _answered(
        self,
        answer: bytes,
        prompt: str | None,
        messages: list[dict[str, Any]] | None,
        record: bool | None,
    ) -> Completion:
        completion = decode_completion(answer)
        if record if record is not None else messages is None:
            record_exchange(self, prompt, completion)
        return completion

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        msg = (
            f"session {self.session_id} runs on the {self.backend} backend, where "
            f"{name!r} is not available: a remote step is a leaf (spawn, memory and "
            "conversations stay with inline sessions)"
        )
        raise NotAllowedError(msg)


class AsyncRemoteSession(RemoteSession):
    """``RemoteSession`` for an ``async def`` skill: the checkpoints are awaited."""

    async def checkpoint(self) -> None:  # type: ignore[override]
        self._check()

    async def progress(self, note: str = "", **data: Any) -> None:  # type: ignore[override]
        RemoteSession.progress(self, note, **data)

    async def send_to_parent(self, message: Any) -> None:  # type: ignore[override]
        RemoteSession.send_to_parent(self, message)

    async def sleep(self, seconds: float) -> None:  # type: ignore[override]
        self._check()
        await asyncio.to_thread(self._control.changed.wait, max(0.0, seconds))
        self._check()

    async def complete(  # type: ignore[override]
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
        """Call the agent's chat model through the node; see ``RemoteSession.complete``.
        The wait holds no thread."""
        call = model_call(self, prompt, messages, max_tokens, model, stream, options)
        data = encode_call(call)
        self._check()
        call_id, awaited = self._control.expect()
        loop = asyncio.get_running_loop()
        try:
            self._emit(("complete", (call_id, data)))
            while True:
                woken = loop.create_future()
                awaited.waker = functools.partial(_wake_soon, loop, woken)  # before looking
                if not self._landing():
                    self._check()
                answer = awaited.answer
                if answer is not None:
                    break
                await woken
        except BaseException:
            self._abandon(call_id)
            raise
        finally:
            awaited.waker = None
            self._control.forget(call_id)
        return self._answered(answer, prompt, messages, record)

    async def add_tool_result(  # type: ignore[override]
        self, tool_call_id: str, content: Any, name: str | None = None
    ) -> None:
        RemoteSession.add_tool_result(self, tool_call_id, content, name)


def _wake_soon(loop: asyncio.AbstractEventLoop, woken: asyncio.Future[None]) -> None:
    """Resolve ``woken`` on ``loop`` (from the thread an answer or cancel came on)."""

    def resolve() -> None:
        if not woken.done():
            woken.set_result(None)

    with contextlib.suppress(RuntimeError):  # the step's loop has closed
        loop.call_soon_threadsafe(resolve)


def execute_step(
    job: StepJob, control: StepControl, emit: Callable[[StepEvent], None], worker: dict[str, Any]
) -> StepEnd:
    """Run ``job`` in this worker and say how it ended; never raises.

    A raise becomes ``crashed`` with this worker's traceback in ``detail``;
    ``Cancelled`` escaping the skill ends it cancelled; a return is its outcome.
    """
    try:
        skill = pickle.loads(job.skill)  # noqa: S301 - bytes the node itself serialised
    except BaseException as exc:  # noqa: BLE001 - a skill that cannot load is a crash
        return StepEnd(error=_remote_crash(exc, job, worker), worker=worker)
    handle_class = AsyncRemoteSession if job.is_async else RemoteSession
    handle = handle_class(job, control, emit)
    # the session's span is current here too: what the step traces joins its trace
    span = enter_span(job.info.trace)
    try:
        value = skill(handle)
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
        return StepEnd(outcome=to_outcome(value), worker=worker)
    except Cancelled:
        return StepEnd(cancelled=True, worker=worker)
    except BaseException as exc:  # noqa: BLE001 - every raise ends the step somehow
        return StepEnd(error=_remote_crash(exc, job, worker), worker=worker)
    finally:
        leave_span(span)


async def _awaited(value: Any) -> Any:
    return await value


def _remote_crash(exc: BaseException, job: StepJob, worker: dict[str, Any]) -> ErrorInfo:
    info = crash_info(exc)
    return ErrorInfo(
        code=info.code,
        message=info.message,
        detail={**info.detail, "backend": job.backend, "worker": worker},
    )


def worker_facts(backend: str) -> dict[str, Any]:
    """Where a step ran, for ``ErrorInfo.detail`` and tests: backend, host pid."""
    return {"backend": backend, "pid": os.getpid()}
