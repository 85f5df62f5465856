"""Steps that run outside this process: the job, the remote handle, the node's side.

A session on the ``process`` or ``ray`` backend runs its skill in a pooled
worker (a process, a Ray actor). What crosses is a :class:`StepJob` (the
pickled skill and the session's ``SessionInfo``) one way, and events
(progress, messages to the parent) and one :class:`StepEnd` the other. The
node side, :func:`run_remote`, is a task on the node's event loop: it holds
the session's compute slot, forwards a cancellation request to the step,
and — when the session is fenced (forced termination, TTL) — kills the
worker, so the step really stops. It reports the run's end exactly once.

A remote step is a leaf: it reads its identity and inputs, reports progress,
sends to its parent and honours cancellation at ``checkpoint()``; spawning,
shared memory and conversations stay with inline sessions (their state is the
node's store, which remote steps never write).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import itertools
import os
import pickle
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sessiontree.actors._conversation import as_json
from sessiontree.actors._core import Cancelled, SessionContext, SessionCore
from sessiontree.actors._execution import RunEnd, crash_info, finish_run, to_outcome
from sessiontree.actors._host import SessionHost
from sessiontree.protocol import (
    BackendUnavailableError,
    ErrorCode,
    ErrorInfo,
    NotAllowedError,
    Outcome,
    SessionInfo,
    SessionKind,
)

__all__ = [
    "ExecutionBackend",
    "PooledRun",
    "RemoteRun",
    "RemoteSession",
    "StepEnd",
    "StepJob",
    "execute_step",
    "run_remote",
    "unavailable_end",
]

Event = tuple[str, Any]
"""What a step reports before it ends: ``("progress", (note, data))`` or ``("send", message)``."""


@dataclass(frozen=True, slots=True)
class StepJob:
    """One run of a skill in a worker: ``skill`` as the backend serialised it."""

    job_id: int
    skill: bytes
    info: SessionInfo
    is_async: bool
    backend: str
    cancel: ErrorCode | None = None


@dataclass(frozen=True, slots=True)
class StepEnd:
    """How a remote step ended (mirrors ``RunEnd``); ``worker`` names where it ran.
    ``events`` carries what the step reported when the backend returns them
    with the end instead of as they happen."""

    outcome: Outcome | None = None
    error: ErrorInfo | None = None
    cancelled: bool = False
    events: tuple[Event, ...] = ()
    worker: dict[str, Any] = field(default_factory=dict)


class RemoteRun(Protocol):
    """A step handed to a backend; ``future`` resolves on the node's loop."""

    future: asyncio.Future[StepEnd]

    def cancel(self, code: ErrorCode) -> None:
        """Ask the step to stop (its next ``checkpoint()`` raises ``Cancelled``)."""

    def kill(self) -> None:
        """Stop the step now: its worker is killed and replaced."""


class PooledRun:
    """A ``RemoteRun`` as a pool keeps it: queued, then on a worker, then ended.
    ``cancel_code`` is what a cancel asked while it waited for a worker."""

    def __init__(
        self,
        pool: Any,
        job: StepJob,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[Event], None],
    ) -> None:
        self.pool = pool
        self.job = job
        self.loop = loop
        self.on_event = on_event
        self.future: asyncio.Future[StepEnd] = loop.create_future()
        self.cancel_code: ErrorCode | None = job.cancel

    def job_to_send(self) -> StepJob:
        """The job as a worker gets it: with the cancel it was given meanwhile."""
        if self.cancel_code is None or self.job.cancel is not None:
            return self.job
        return dataclasses.replace(self.job, cancel=self.cancel_code)

    def resolve(self, end: StepEnd) -> None:
        """End the run on the node's loop (from any thread; the first end wins,
        and the events it carries are applied before it)."""

        def settle() -> None:
            if self.future.done():
                return  # already ended (closed, failed): late events are dropped
            for event in end.events:
                self.on_event(event)
            self.future.set_result(end)

        with contextlib.suppress(RuntimeError):  # the loop closed with the node
            self.loop.call_soon_threadsafe(settle)

    def cancel(self, code: ErrorCode) -> None:
        self.pool._cancel(self, code)

    def kill(self) -> None:
        self.pool._kill(self)


def unavailable_end(job: StepJob, why: str) -> StepEnd:
    """The end of a step its backend can no longer run (closed, broken, cluster gone)."""
    return StepEnd(
        error=ErrorInfo(
            code=ErrorCode.BACKEND_UNAVAILABLE,
            message=f"session {job.info.session_id} could not finish on the {job.backend} "
            f"backend: {why}",
            detail={"backend": job.backend},
        ),
        worker={"backend": job.backend},
    )


class ExecutionBackend(Protocol):
    """Where steps run outside the node's own threads (``process``, ``ray``)."""

    name: str

    @property
    def unavailable(self) -> str | None:
        """Why no step can run here any more (its pool failed, its cluster is
        gone), or None while it works."""

    def start(self) -> None:
        """Start the pool (in the background; idempotent). Raises
        ``BackendUnavailableError`` when the backend cannot work at all."""

    def serialise(self, skill: Callable[..., Any]) -> bytes:
        """The skill as its workers load it; ``TypeError`` naming what could not
        be serialised."""

    def submit(
        self, job: StepJob, loop: asyncio.AbstractEventLoop, on_event: Callable[[Event], None]
    ) -> RemoteRun:
        """Queue ``job`` for the next free worker (called on ``loop``); ``on_event``
        runs on ``loop`` for each event the step reports while it runs."""

    def close(self) -> None:
        """Stop every worker (a running step is killed)."""


# -- the worker's side ----------------------------------------------------------------


class StepControl:
    """A running step's cancellation state, set from the worker's control channel."""

    def __init__(self, job_id: int, code: ErrorCode | None = None) -> None:
        self.job_id = job_id
        self.code = code
        self.raised = False
        self.changed = threading.Event()
        if code is not None:
            self.changed.set()

    def cancel(self, code: ErrorCode) -> None:
        if self.code is None:
            self.code = code
        self.changed.set()


class RemoteSession:
    """The handle a skill gets in a worker: identity, inputs, ``checkpoint()``,
    ``progress``, ``send_to_parent`` and ``sleep``. It is made for one step and
    dropped after it, so nothing of one session reaches the next on the same
    worker. Everything that needs the node (spawn, collect, memory,
    conversations) raises ``NotAllowedError`` naming the method and backend.
    """

    def __init__(self, job: StepJob, control: StepControl, emit: Callable[[Event], None]) -> None:
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


def execute_step(
    job: StepJob, control: StepControl, emit: Callable[[Event], None], worker: dict[str, Any]
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
    try:
        value = skill(handle)
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
        return StepEnd(outcome=to_outcome(value), worker=worker)
    except Cancelled:
        return StepEnd(cancelled=True, worker=worker)
    except BaseException as exc:  # noqa: BLE001 - every raise ends the step somehow
        return StepEnd(error=_remote_crash(exc, job, worker), worker=worker)


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


# -- the node's side -----------------------------------------------------------------


_JOB_IDS = itertools.count(1)  # next() on a count is atomic in CPython


def _watch(core: SessionCore, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    """A future done at the session's next ``wake()`` (a cancel request, a fence)."""
    fut: asyncio.Future[None] = loop.create_future()
    with core.cond:
        core.add_async_waiter(loop, fut)
    return fut


async def run_remote(
    host: SessionHost,
    core: SessionCore,
    backend: ExecutionBackend,
    skill: bytes,
    is_async: bool,
) -> None:
    """Run one remote step for ``core`` and report its end (exactly once).

    A cancel request is forwarded to the step; the task being cancelled (the
    session was fenced: forced termination, TTL, shutdown) kills the worker.
    A backend that cannot run it ends the session ``failed`` with
    ``backend_unavailable``.
    """
    loop = asyncio.get_running_loop()
    if core.fenced:
        finish_run(host, core, RunEnd(cancelled=True))
        return
    run: RemoteRun | None = None
    end: RunEnd
    try:
        if not core.holds_slot:
            await core.acquire_slot_async()
        core.touch()
        job = StepJob(
            job_id=next(_JOB_IDS),
            skill=skill,
            info=core.info,
            is_async=is_async,
            backend=backend.name,
            cancel=core.cancel_code,
        )
        run = backend.submit(job, loop, lambda event: _apply(host, core, event))
        forwarded = job.cancel is not None
        while not run.future.done():
            watch = _watch(core, loop)
            if core.cancel_code is not None and not forwarded:
                forwarded = True
                run.cancel(core.cancel_code)
            if core.fenced:
                raise asyncio.CancelledError  # the fence's task cancel may still be on its way
            await asyncio.wait((run.future, watch), return_when=asyncio.FIRST_COMPLETED)
            watch.cancel()
        end = _run_end(run.future.result())
    except asyncio.CancelledError:
        if run is not None:
            run.kill()
        end = RunEnd(cancelled=True)
    except BackendUnavailableError as exc:
        end = RunEnd(error=ErrorInfo(code=ErrorCode.BACKEND_UNAVAILABLE, message=str(exc)))
    except Exception as exc:  # noqa: BLE001 - a backend's own failure ends the run, never the loop
        end = RunEnd(error=crash_info(exc))
    finish_run(host, core, end)


def _apply(host: SessionHost, core: SessionCore, event: Event) -> None:
    if core.fenced:
        return
    kind, payload = event
    with contextlib.suppress(Exception):  # a node that is closing drops late progress
        if kind == "progress":
            note, data = payload
            host.progress(core, note, data)
        elif kind == "send":
            host.send_to_parent(core, payload)


def _run_end(end: StepEnd) -> RunEnd:
    if end.cancelled:
        return RunEnd(cancelled=True)
    if end.error is not None:
        return RunEnd(error=end.error)
    return RunEnd(outcome=end.outcome)
