"""The ``process`` backend: steps in a pool of pre-started worker processes.

Each worker runs one step at a time. A second thread in the worker reads the
control channel, so a cancel request reaches a step that is busy computing,
and the node's answer to a model call reaches the step waiting on it.
Killing a step kills its process (SIGKILL) and the pool starts a replacement.
Workers are started with the ``spawn`` method: a fresh interpreter that never
inherits the node's threads or its open LMDB environment (forking either is
unsafe). One monitor thread on the node reads every worker's pipe and its
process sentinel. A worker whose node disappears exits on its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from sessiontree.actors.backends._pool import PooledRun, unavailable_end
from sessiontree.actors.backends._protocol import StepEnd, StepEvent, StepJob
from sessiontree.actors.backends._worker import StepControl, execute_step, worker_facts
from sessiontree.protocol import BackendUnavailableError, ErrorCode, ErrorInfo

__all__ = ["ProcessBackend"]

log = logging.getLogger("sessiontree.backend.process")

_MAX_FAILED_STARTS = 3


def worker_main(conn: Connection) -> None:
    """A worker process: take jobs from ``conn``, run each, answer its end.

    Runs in the child. SIGINT is ignored (the node stops its workers itself);
    losing the node (the pipe closes) ends the worker.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    jobs: queue.SimpleQueue[tuple[StepJob, StepControl] | None] = queue.SimpleQueue()
    # Set by the reader as a job arrives (one at a time: the node sends the next
    # only after this one's end), so a cancel right behind it finds it.
    current: list[StepControl | None] = [None]
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            conn.send(message)

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the node is gone: nothing will ever read our answers
            match message:
                case ("run", job):
                    control = StepControl(job.job_id, job.cancel)
                    current[0] = control
                    jobs.put((job, control))
                case ("cancel", job_id, code):
                    running = current[0]
                    if running is not None and running.job_id == job_id:
                        running.cancel(ErrorCode(code))
                case ("answer", job_id, call_id, data):
                    running = current[0]
                    if running is not None and running.job_id == job_id:
                        running.answer(call_id, data)
                case ("stop",):
                    jobs.put(None)

    threading.Thread(target=read, name="sessiontree-worker-control", daemon=True).start()
    facts = worker_facts("process")
    send(("ready", os.getpid()))
    while (item := jobs.get()) is not None:
        job, control = item
        job_id = job.job_id

        def emit(event: StepEvent, job_id: int = job_id) -> None:
            send(("event", job_id, event))

        end = execute_step(job, control, emit, facts)
        current[0] = None
        del item, job, control  # the next session finds nothing of this one
        try:
            send(("end", job_id, end))
        except (TypeError, pickle.PicklingError, AttributeError) as exc:
            send(("end", job_id, StepEnd(error=_unsendable(exc), worker=facts)))


def _unsendable(exc: BaseException) -> ErrorInfo:
    return ErrorInfo(
        code=ErrorCode.CRASHED,
        message=f"the step's result could not be carried back: {exc}",
        detail={"type": type(exc).__name__},
    )


@dataclass(eq=False)
class _Worker:
    process: BaseProcess
    conn: Connection
    pid: int | None = None
    run: _ProcessRun | None = None
    killed: bool = False
    send_lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, message: tuple[Any, ...]) -> None:
        with self.send_lock:
            self.conn.send(message)


class _ProcessRun(PooledRun):
    worker: _Worker | None = None


class ProcessBackend:
    """A pool of ``workers`` processes (see the module docstring).

    ``start()`` launches them in the background; a step queued before one is
    ready waits for it. ``close()`` stops every worker; a step still running is
    killed and ends ``failed`` with ``backend_unavailable``.
    """

    name = "process"

    def __init__(self, workers: int | None = None, start_method: str = "spawn") -> None:
        self.size = workers or os.cpu_count() or 1
        self._context = multiprocessing.get_context(start_method)
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._idle: collections.deque[_Worker] = collections.deque()
        self._queued: collections.deque[_ProcessRun] = collections.deque()
        self._wake_r, self._wake_w = self._context.Pipe(duplex=False)
        self._monitor: threading.Thread | None = None
        self._closed = False
        self.started = 0
        """Worker processes started so far (replacements included)."""
        self.killed = 0
        """Workers killed to stop a step (forced termination, TTL, shutdown)."""
        self._up = threading.Event()  # every first worker is ready
        self._failed_starts = 0  # workers in a row that died before they were ready
        self._broken: str | None = None

    @property
    def unavailable(self) -> str | None:
        return self._broken

    # -- the pool's life ----------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._closed:
                msg = "the process backend is closed"
                raise BackendUnavailableError(msg)
            if self._monitor is not None:
                return
            for _ in range(self.size):
                self._spawn_locked()
            self._monitor = threading.Thread(
                target=self._watch, name="sessiontree-process-pool", daemon=True
            )
            self._monitor.start()

    def _spawn_locked(self) -> None:
        parent, child = self._context.Pipe(duplex=True)
        # every start method's context has Process; typeshed's BaseContext does not say so
        process = self._context.Process(  # type: ignore[attr-defined]
            target=worker_main, args=(child,), name="sessiontree-worker", daemon=True
        )
        process.start()
        child.close()
        self._workers.append(_Worker(process, parent))
        self.started += 1
        self._wake()

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers)
            queued = [*self._queued, *(w.run for w in workers if w.run is not None)]
            self._queued.clear()
        for run in queued:
            run.resolve(unavailable_end(run.job, "the process backend closed"))
        for worker in workers:
            with contextlib.suppress(OSError, ValueError):
                worker.send(("stop",))
        for worker in workers:
            worker.process.join(timeout if worker.run is None else 0.0)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout)
        self._wake()
        if self._monitor is not None:
            self._monitor.join(timeout)
        for worker in workers:
            worker.conn.close()

    def wait_ready(self, timeout: float) -> bool:
        """Block until the first ``workers`` processes are ready (True), or the
        pool failed or ``timeout`` real seconds passed (False). For benchmarks
        and tests."""
        return self._up.wait(timeout) and self._broken is None

    # -- steps ------------------------------------------------------------------------------

    def serialise(self, skill: Callable[..., Any]) -> bytes:
        """``pickle`` by reference: module-level functions and importable callables.

        Raises ``TypeError`` naming the skill when it cannot be pickled (a lambda,
        a nested function, a callable holding a lock…).
        """
        try:
            return pickle.dumps(skill, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            msg = f"{_name(skill)} cannot be pickled: {exc}"
            raise TypeError(msg) from None

    def submit(
        self, job: StepJob, loop: asyncio.AbstractEventLoop, on_event: Callable[[StepEvent], None]
    ) -> _ProcessRun:
        with self._lock:
            if self._closed or self._broken is not None:
                msg = self._broken or "the process backend is closed"
                raise BackendUnavailableError(msg)
            run = _ProcessRun(self, job, loop, on_event)
            self._queued.append(run)
            self._dispatch_locked()
        return run

    def _dispatch_locked(self) -> None:
        while self._queued and self._idle:
            worker = self._idle.popleft()
            run = self._queued.popleft()
            try:
                worker.send(("run", run.job_to_send()))
            except (OSError, ValueError):  # it died a moment ago; the monitor replaces it
                self._queued.appendleft(run)
                continue
            worker.run = run
            run.worker = worker

    def _cancel(self, run: _ProcessRun, code: ErrorCode) -> None:
        with self._lock:
            if run.cancel_code is None:
                run.cancel_code = code
            worker = run.worker
        if worker is not None:
            with contextlib.suppress(OSError, ValueError):
                worker.send(("cancel", run.job.job_id, code.value))

    def _answer(self, run: _ProcessRun, call_id: int, data: bytes) -> None:
        with self._lock:
            worker = run.worker
            if worker is None or worker.run is not run:
                return  # the step has ended: nobody waits for it
        with contextlib.suppress(OSError, ValueError):  # it died; its sentinel reports it
            worker.send(("answer", run.job.job_id, call_id, data))

    def _kill(self, run: _ProcessRun) -> None:
        with self._lock:
            if run in self._queued:
                self._queued.remove(run)
            worker = run.worker
            if worker is None or worker.run is not run:
                return
            worker.killed = True
            self.killed += 1
        with contextlib.suppress(OSError):
            worker.process.kill()

    # -- the monitor thread -----------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send_bytes(b"!")

    def _watch(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # the monitor must never die silently
            log.exception("the process pool's monitor failed")
            self._break(f"the process pool's monitor failed ({type(exc).__name__}: {exc})")

    def _break(self, why: str) -> None:
        """No step can run any more: every queued and running one ends unavailable."""
        with self._lock:
            if self._broken is None:
                self._broken = why
                log.error("process backend unavailable: %s", why)
            stranded = [*self._queued, *(w.run for w in self._workers if w.run is not None)]
            self._queued.clear()
            for worker in self._workers:
                worker.run = None
        self._up.set()
        for run in stranded:
            run.resolve(unavailable_end(run.job, why))

    def _serve(self) -> None:
        while True:
            with self._lock:
                workers = list(self._workers)
                closed = self._closed
            if closed and not workers:
                return
            waitables: list[Any] = [self._wake_r]
            by_handle: dict[Any, tuple[_Worker, bool]] = {}
            for worker in workers:
                waitables += [worker.conn, worker.process.sentinel]
                by_handle[worker.conn] = (worker, True)
                by_handle[worker.process.sentinel] = (worker, False)
            for ready in multiprocessing.connection.wait(waitables):
                if ready is self._wake_r:
                    with contextlib.suppress(OSError, EOFError):
                        while self._wake_r.poll():
                            self._wake_r.recv_bytes()
                    continue
                worker, is_conn = by_handle[ready]
                if is_conn:
                    self._read(worker)
                else:
                    self._exited(worker)
            if closed:
                return

    def _read(self, worker: _Worker) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            return  # it is exiting; its sentinel reports it
        except Exception as exc:  # an answer that does not unpickle here
            log.exception("process worker %s sent an unreadable answer", worker.pid)
            with self._lock:
                run, worker.run = worker.run, None
                if run is not None and not self._closed:
                    self._idle.append(worker)
                    self._dispatch_locked()
            if run is not None:
                run.resolve(StepEnd(error=_unsendable(exc), worker={"pid": worker.pid}))
            return
        match message:
            case ("ready", pid):
                with self._lock:
                    worker.pid = pid
                    if not self._closed:
                        self._idle.append(worker)
                        if sum(1 for w in self._workers if w.pid is not None) >= self.size:
                            self._up.set()
                        self._dispatch_locked()
            case ("event", job_id, event):
                run = worker.run
                if run is not None and run.job.job_id == job_id:
                    with contextlib.suppress(RuntimeError):
                        run.loop.call_soon_threadsafe(run.on_event, event)
            case ("end", job_id, end):
                with self._lock:
                    run = worker.run
                    if run is None or run.job.job_id != job_id or worker.killed:
                        return
                    worker.run = None
                    self._idle.append(worker)
                    self._dispatch_locked()
                run.resolve(end)

    def _exited(self, worker: _Worker) -> None:
        worker.process.join(1.0)
        code = worker.process.exitcode
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
            if worker in self._idle:
                self._idle.remove(worker)
            run, worker.run = worker.run, None
            if worker.pid is None and not worker.killed:
                self._failed_starts += 1
            elif worker.pid is not None:
                self._failed_starts = 0
            replace = not self._closed and self._broken is None
        worker.conn.close()
        # The pool settles first (replaced, or unavailable), then the step's end
        # is told: whoever reacts to that end finds the pool as it will stay.
        if self._failed_starts >= _MAX_FAILED_STARTS:
            self._break(
                f"{self._failed_starts} worker processes in a row exited while starting "
                f"(last exit code {code}); a script that starts a node with this backend "
                "needs the `if __name__ == '__main__':` guard"
            )
        elif replace:
            try:
                with self._lock:
                    self._spawn_locked()
            except Exception as exc:  # no process can start (EMFILE, ENOMEM…)
                log.exception("no replacement worker process could start")
                self._break(f"no worker process could start ({type(exc).__name__}: {exc})")
        if run is not None and not worker.killed:
            log.warning("process worker %s died (exit code %s) running a step", worker.pid, code)
            run.resolve(_died(run.job, worker.pid, code))


def _died(job: StepJob, pid: int | None, code: int | None) -> StepEnd:
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return StepEnd(
        error=ErrorInfo(
            code=ErrorCode.CRASHED,
            message=f"the worker process of session {job.info.session_id} died ({how})",
            detail={"backend": "process", "pid": pid, "exit_code": code},
        ),
        worker={"backend": "process", "pid": pid},
    )


def _name(skill: Callable[..., Any]) -> str:
    return repr(getattr(skill, "__qualname__", None) or skill)
