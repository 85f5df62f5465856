"""The node's side of a remote step: a task on the node's event loop.

:func:`run_remote` holds the session's compute slot, submits the step to its
backend, forwards a cancellation request to it and — when the session is
fenced (forced termination, TTL) — kills the worker, so the step really
stops. It reports the run's end exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from sessiontree.actors._core import SessionCore
from sessiontree.actors._execution import crash_info, finish_run
from sessiontree.actors._host import RunEnd, SessionHost
from sessiontree.actors.backends._protocol import (
    ExecutionBackend,
    RemoteRun,
    StepEnd,
    StepEvent,
    StepJob,
)
from sessiontree.protocol import BackendUnavailableError, ErrorCode, ErrorInfo

__all__ = ["run_remote"]


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


def _apply(host: SessionHost, core: SessionCore, event: StepEvent) -> None:
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
