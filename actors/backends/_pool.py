"""What the pools share on the node's side: a queued run, and the end of a step
its backend can no longer run."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from sessiontree.actors.backends._calls import encode_completion
from sessiontree.actors.backends._protocol import StepEnd, StepEvent, StepJob
from sessiontree.protocol import Completion, ErrorCode, ErrorInfo

__all__ = ["PooledRun", "unavailable_end"]


class PooledRun:
    """A ``RemoteRun`` as a pool keeps it: queued, then on a worker, then ended.
    ``cancel_code`` is what a cancel asked while it waited for a worker."""

    def __init__(
        self,
        pool: Any,
        job: StepJob,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[StepEvent], None],
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

    def answer(self, call_id: int, completion: Completion) -> None:
        self.pool._answer(self, call_id, encode_completion(completion))


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
