"""The node's side of a remote step: a task on the node's event loop.

:func:`run_remote` holds the session's compute slot, submits the step to its
backend, forwards a cancellation request to it and — when the session is
fenced (forced termination, TTL) — kills the worker, so the step really
stops. It reports the run's end exactly once.

The step's model calls run here, on the node (:class:`StepCalls`): each one
the step sends is the host's ``amodel_call``, so it is reserved, sent and
settled as an inline session's, and its ``Completion`` goes back to the
step through its backend. A call the step abandons (it was cancelled while
waiting), and every call still open when the step ends or is killed, is
cancelled: its request is closed and what it spent is settled — before the
step's end is reported, so its result counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging

from sessiontree.actors._core import SessionCore
from sessiontree.actors._execution import crash_info, finish_run
from sessiontree.actors._host import RunEnd, SessionHost
from sessiontree.actors.backends._calls import decode_call
from sessiontree.actors.backends._protocol import (
    ExecutionBackend,
    RemoteRun,
    StepEnd,
    StepEvent,
    StepJob,
)
from sessiontree.protocol import BackendUnavailableError, Completion, ErrorCode, ErrorInfo

__all__ = ["StepCalls", "run_remote"]

log = logging.getLogger("sessiontree.backend")

#: How long the end of a step waits for its cancelled model calls to settle
#: (real seconds; settling is one message to the Cortex, so this is a backstop).
SETTLE_SECONDS = 5.0


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
    calls = StepCalls(host, core)
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
            attempt=core.attempt,
        )
        run = backend.submit(job, loop, functools.partial(_apply, host, core, calls))
        calls.run = run
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
    await calls.close()  # nothing waits on them any more: closed and settled
    finish_run(host, core, end)


class StepCalls:
    """The model calls of one remote step, on the node's loop: started as the
    step asks, answered through ``run``, cancelled when abandoned or when the
    step is over (``close``)."""

    def __init__(self, host: SessionHost, core: SessionCore) -> None:
        self.host = host
        self.core = core
        self.run: RemoteRun | None = None
        self.open: dict[int, asyncio.Future[Completion]] = {}
        self.cancelled: list[asyncio.Future[Completion]] = []
        self.closed = False

    def start(self, call_id: int, data: bytes) -> None:
        """Run the step's call ``call_id`` (its encoded ``ModelCall``) as the host
        runs an inline session's; a call that does not decode is answered with
        ``rejected_input``."""
        if self.closed or call_id in self.open:
            return
        self.core.touch()
        call = decode_call(data)
        if isinstance(call, ErrorInfo):
            self._answer(call_id, Completion(error=call))
            return
        try:
            pending = self.host.amodel_call(self.core, call)
        except Exception as exc:  # noqa: BLE001 - the step is told, never left waiting
            self._answer(call_id, Completion(error=crash_info(exc)))
            return
        self.open[call_id] = pending
        pending.add_done_callback(functools.partial(self._done, call_id))

    def abandon(self, call_id: int) -> None:
        """The step stopped waiting for ``call_id``: close its request."""
        pending = self.open.pop(call_id, None)
        if pending is not None:
            pending.cancel()
            self.cancelled = [f for f in self.cancelled if not f.done()]
            self.cancelled.append(pending)

    async def close(self) -> None:
        """The step is over: cancel every call still open, and wait (bounded)
        until every cancelled call has settled what it spent."""
        self.closed = True
        still, self.open = self.open, {}
        for pending in still.values():
            pending.cancel()
        settling = [f for f in (*self.cancelled, *still.values()) if not f.done()]
        if settling:
            # the run's own task may be cancelled again meanwhile: its end is reported anyway
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(settling, timeout=SETTLE_SECONDS)

    def _done(self, call_id: int, pending: asyncio.Future[Completion]) -> None:
        if self.open.pop(call_id, None) is None or pending.cancelled():
            return  # abandoned, or the step is over
        self.core.touch()
        exc = pending.exception()
        if exc is None:
            completion = pending.result()
        else:  # the host answers every call; this is a bug, told to the step as a crash
            log.error(
                "model call %s of session %s failed",
                call_id,
                self.core.session_id,
                exc_info=exc,
            )
            completion = Completion(error=crash_info(exc))
        self._answer(call_id, completion)

    def _answer(self, call_id: int, completion: Completion) -> None:
        run = self.run
        if run is None or self.closed:
            return
        try:
            run.answer(call_id, completion)
        except Exception:  # a backend's own failure: the step's end will say what became of it
            log.exception("the answer to model call %s could not be sent", call_id)


def _apply(host: SessionHost, core: SessionCore, calls: StepCalls, event: StepEvent) -> None:
    if core.fenced:
        return
    kind, payload = event
    with contextlib.suppress(Exception):  # a node that is closing drops late progress
        if kind == "progress":
            note, data = payload
            host.progress(core, note, data)
        elif kind == "send":
            host.send_to_parent(core, payload)
        elif kind == "complete":
            call_id, data = payload
            calls.start(call_id, data)
        elif kind == "abandon":
            calls.abandon(payload)


def _run_end(end: StepEnd) -> RunEnd:
    if end.cancelled:
        return RunEnd(cancelled=True)
    if end.error is not None:
        return RunEnd(error=end.error)
    return RunEnd(outcome=end.outcome)
