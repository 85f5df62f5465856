"""The worker's side of a remote step: the handle a skill gets, and running it.

A remote step is a leaf: it reads its identity and inputs, reports progress,
sends to its parent and honours cancellation at ``checkpoint()``; spawning,
shared memory and conversations stay with inline sessions (their state is the
node's store, which remote steps never write). What runs here is pickled to
the worker, so it holds nothing of the node.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import threading
import uuid
from collections.abc import Callable
from typing import Any

from sessiontree.actors._core import Cancelled, SessionContext
from sessiontree.actors._execution import crash_info, to_outcome
from sessiontree.actors.backends._protocol import StepEnd, StepEvent, StepJob
from sessiontree.protocol import (
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
