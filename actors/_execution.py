"""Where skills run: the step executor (threads), the event loop, and one run.

The session actor never runs skill code. It hands a run to one of these:
sync skills go to the :class:`StepExecutor` (daemon threads created on demand
up to a cap, reused when idle), async skills to the :class:`EventLoopThread`
(one thread, any number of waiting sessions). A run always ends by calling
``SessionHost.run_ended`` exactly once, whatever the skill does.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import threading
import traceback
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

import msgspec

from sessiontree.actors._core import Cancelled, SessionCore
from sessiontree.actors._host import RunEnd, SessionHost
from sessiontree.actors._mailbox import mark_serving_thread, unmark_serving_thread
from sessiontree.actors._trace_scope import enter_span, leave_span
from sessiontree.protocol import (
    CorruptRecordError,
    ErrorCode,
    ErrorInfo,
    EscalationError,
    NodeClosedError,
    NonRetryableError,
    Outcome,
    SessionResult,
    StoreError,
    StoreLockedError,
)

__all__ = [
    "EventLoopThread",
    "StepExecutor",
    "crash_info",
    "finish_run",
    "is_async_skill",
    "refuse_run",
    "run_async",
    "run_sync",
    "store_refused",
    "to_outcome",
]

log = logging.getLogger("sessiontree.execution")


def crash_info(exc: BaseException) -> ErrorInfo:
    """``crashed`` with the exception's type, message and traceback in ``detail``
    (``retryable`` False for a ``NonRetryableError``); ``escalated`` with the
    children's errors for an ``EscalationError``."""
    kind = type(exc)
    detail: dict[str, Any] = {
        "type": f"{kind.__module__}.{kind.__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    if isinstance(exc, EscalationError):
        return ErrorInfo(
            code=ErrorCode.ESCALATED, message=str(exc), detail={**detail, "children": exc.errors}
        )
    if isinstance(exc, NonRetryableError):
        detail["retryable"] = False
    return ErrorInfo(code=ErrorCode.CRASHED, message=f"{kind.__name__}: {exc}", detail=detail)


def to_outcome(value: object) -> Outcome:
    """Turn a skill's return value into an ``Outcome``.

    ``str`` → summary; a mapping → artifacts; ``Outcome``/``SessionResult`` →
    their fields; ``None`` → empty. Artifacts are copied as plain JSON data.
    Raises ``TypeError`` for anything else, or for artifacts that are not
    JSON values.
    """
    if value is None:
        return Outcome()
    if isinstance(value, Outcome):
        outcome = value
    elif isinstance(value, str):
        return Outcome(summary=value)
    elif isinstance(value, SessionResult):
        outcome = Outcome(
            summary=value.summary, artifacts=dict(value.artifacts), memory_ids=value.memory_ids
        )
    elif isinstance(value, Mapping):
        outcome = Outcome(artifacts=dict(value))
    else:
        msg = (
            f"a skill must return str, a mapping, Outcome, SessionResult or None, "
            f"not {type(value).__name__}"
        )
        raise TypeError(msg)
    if not isinstance(outcome.summary, str):
        msg = f"summary must be a str, not {type(outcome.summary).__name__}"
        raise TypeError(msg)
    if not isinstance(outcome.artifacts, Mapping):
        msg = f"artifacts must be a mapping, not {type(outcome.artifacts).__name__}"
        raise TypeError(msg)
    ids = outcome.memory_ids
    if isinstance(ids, str) or not all(isinstance(i, str) for i in _iterable(ids)):
        msg = f"memory_ids must be a sequence of str, not {ids!r}"
        raise TypeError(msg)
    try:
        # A detached copy as plain JSON data: later mutation by the skill cannot
        # reach the result, and tuples become lists as they will on the wire.
        artifacts = msgspec.json.decode(msgspec.json.encode(outcome.artifacts))
    except (TypeError, ValueError, OverflowError, msgspec.DecodeError) as exc:
        msg = f"artifacts must be JSON values: {exc}"
        raise TypeError(msg) from exc
    return Outcome(summary=outcome.summary, artifacts=artifacts, memory_ids=tuple(ids))


def _iterable(value: object) -> tuple[object, ...]:
    if isinstance(value, Iterable):
        return tuple(value)
    return (None,)


_CANCELLED = RunEnd(cancelled=True)  # frozen: one shared by every cancelled run


def store_refused(exc: BaseException) -> StoreError | None:
    """The store's refusal of a write that ``exc`` is, or was raised from
    (``StoreError``: the map is full, a commit failed, the file is damaged),
    else None. A record that does not decode (``CorruptRecordError``) is not
    a refusal."""
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        if isinstance(found, StoreError) and not isinstance(
            found, CorruptRecordError | StoreLockedError
        ):
            return found
        found = found.__cause__ or found.__context__
    return None


def _refused_end(exc: BaseException, refusal: StoreError, cycle: int) -> RunEnd:
    """A Main's cycle the store refused: the store's code and message, the
    traceback of what the skill raised in ``detail``."""
    error = ErrorInfo(code=refusal.code, message=str(refusal), detail=crash_info(exc).detail)
    return RunEnd(error=error, cycle=cycle, store_refused=True)


def _end_by(exc: BaseException, cycle: int) -> RunEnd:
    """How a raise ends a run: ``Cancelled`` (or a forced task's ``CancelledError``)
    is a cancellation, ``KeyboardInterrupt``/``SystemExit`` a crash that also stops
    the node, anything else a crash (a Main's cycle the store refused a write
    of: ``store_refused``)."""
    if isinstance(exc, Cancelled | asyncio.CancelledError):
        return _CANCELLED if cycle == 0 else RunEnd(cancelled=True, cycle=cycle)
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return RunEnd(error=crash_info(exc), fatal=exc, cycle=cycle)
    refusal = store_refused(exc) if cycle else None
    if refusal is not None:
        return _refused_end(exc, refusal, cycle)
    return RunEnd(error=crash_info(exc), cycle=cycle)


def _end_of(result: object, cycle: int) -> RunEnd:
    try:
        return RunEnd(outcome=to_outcome(result), cycle=cycle)
    except TypeError as exc:
        return RunEnd(error=crash_info(exc), cycle=cycle)


class StepExecutor:
    """Daemon threads for sync skills: created on demand up to ``max_threads``.

    Threads are daemons so an abandoned (fenced) skill that never returns
    cannot hold the interpreter open. Work beyond the cap waits in the queue;
    the Cortex refuses spawns of sync branches and workers before that can
    happen. Main cycles run on a pool of their own, so they never hold the
    threads their children need.
    """

    def __init__(self, max_threads: int, name: str = "sessiontree-step") -> None:
        self.max_threads = max_threads
        self._name = name
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._cond = threading.Condition()
        self._threads = 0
        self._idle = 0
        self._closed = False

    def submit(self, work: Callable[[], None]) -> None:
        """Run ``work`` on an idle thread, a new one, or the next free one."""
        with self._cond:
            if self._closed:
                msg = "step executor is closed"
                raise NodeClosedError(msg)
            self._queue.append(work)
            if self._idle > len(self._queue) - 1:
                self._cond.notify()
                return
            if self._threads < self.max_threads:
                self._threads += 1
                thread = threading.Thread(
                    target=self._worker, name=f"{self._name}-{self._threads}", daemon=True
                )
                thread.start()

    def close(self) -> None:
        """Let idle threads exit; busy ones finish their work and exit after."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _worker(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if self._closed:
                        self._threads -= 1
                        return
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                work = self._queue.popleft()
            try:
                work()
            except BaseException:  # a run reports its own end; this is a last guard
                log.exception("step work raised out of its runner")


class EventLoopThread:
    """The asyncio loop a node runs async skills on: one of its own, on a
    daemon thread; or, given ``loop``, an application's loop already running
    on the application's thread (``Node.astart``), adopted as it is.

    Adopting a loop must happen off that loop's thread (its thread is asked
    for its identity; ``ValueError`` on the loop's own thread, where the
    answer could never come). On the adopted thread blocking asks are refused
    until ``close``, which cancels only the tasks started here and leaves the
    loop running for its owner.
    """

    def __init__(
        self, name: str = "sessiontree-loop", *, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self._closing = False
        # Runs submitted from other threads wait here; one wake-up of the loop
        # (a write to its self-pipe, a system call) starts all that queued.
        self._starts: collections.deque[Callable[[], Coroutine[Any, Any, None]]] = (
            collections.deque()
        )
        self._wake_pending = False
        self._ready = threading.Event()
        self._ident: int | None = None  # the thread's, read on every run's end
        self._thread: threading.Thread | None = None
        # On an adopted loop, the tasks started here (the rest is its owner's).
        self._tasks: weakref.WeakSet[asyncio.Task[None]] | None = None
        if loop is None:
            self.loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()
            self._ready.wait(timeout=10.0)
            return
        if asyncio._get_running_loop() is loop:
            msg = "a node adopts a running loop from another thread: await Node.astart()"
            raise ValueError(msg)
        self.loop = loop
        self._tasks = weakref.WeakSet()
        asyncio.run_coroutine_threadsafe(self._adopt(), loop).result(timeout=10.0)

    async def _adopt(self) -> None:
        self._ident = threading.get_ident()
        mark_serving_thread()  # a blocking ask here would hold up every async skill

    def _run(self) -> None:
        self._ident = threading.get_ident()
        mark_serving_thread()  # a blocking ask here would hold up every async skill
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def is_current(self) -> bool:
        """True on the loop's own thread."""
        return threading.get_ident() == self._ident

    def submit(self, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start ``make()`` as a task on the loop. Once ``close`` began, ``make``
        is never called: a task created then would never run a step, and its
        coroutine would be left unawaited."""
        if self.is_current():  # on the loop: the task's first step is its own callback
            if not self._closing:
                self._track(self.loop.create_task(make()))
            return
        self._starts.append(make)
        if not self._wake_pending:
            self._wake_pending = True
            self.loop.call_soon_threadsafe(self._start_queued)

    def _start_queued(self) -> None:
        # On the loop. The flag is cleared before the queue is read, so a run
        # queued after this point always finds it clear and wakes the loop again.
        self._wake_pending = False
        starts = self._starts
        while starts:
            make = starts.popleft()
            if not self._closing:  # read on the loop's thread, like close's stop()
                self._track(self.loop.create_task(make()))

    def _track(self, task: asyncio.Task[None]) -> None:
        if self._tasks is not None:
            self._tasks.add(task)

    def close(self, timeout: float = 5.0) -> None:
        """Cancel every task still on the node's own loop, stop it and join its
        thread; on an adopted loop, cancel the tasks started here and give the
        thread back (blocking asks allowed again), the loop left running."""
        if self._thread is None:
            self._release(timeout)
            return
        if not self._thread.is_alive():
            return

        def stop() -> None:
            self._closing = True
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.call_soon(self.loop.stop)

        self.loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=timeout)

    def _release(self, timeout: float) -> None:
        if self._closing or self.loop.is_closed():
            return
        released = threading.Event()

        def release() -> None:
            self._closing = True
            for task in list(self._tasks or ()):
                task.cancel()
            unmark_serving_thread()
            released.set()

        if self.is_current():
            release()
            return
        try:
            self.loop.call_soon_threadsafe(release)
        except RuntimeError:  # its owner closed it first: nothing runs there any more
            return
        released.wait(timeout)


def finish_run(host: SessionHost, core: SessionCore, end: RunEnd) -> None:
    """Report a run's end exactly once: slot back, flag off, host told, activity down."""
    core.run_over()
    try:
        host.run_ended(core, end)
    finally:
        core.activity.end()


def refuse_run(host: SessionHost, core: SessionCore, refusal: StoreError, cycle: int) -> None:
    """End a Main's cycle that never ran its skill because the store refused the
    write of its start: reported as a run the store refused."""
    core.activity.begin()  # as start_run does: finish_run ends it
    with core.cond:
        core.skill_running = True
    finish_run(host, core, _refused_end(refusal, refusal, cycle))


def is_async_skill(skill: Callable[..., Any]) -> bool:
    """Whether ``skill`` must be awaited (an ``async def`` or an async ``__call__``)."""
    return inspect.iscoroutinefunction(skill) or inspect.iscoroutinefunction(
        getattr(skill, "__call__", None)  # noqa: B004 - a callable object's method
    )


def run_sync(
    host: SessionHost, core: SessionCore, skill: Callable[[Any], object], handle: Any, cycle: int
) -> None:
    """Run a sync skill on the current thread and report its end."""
    end: RunEnd
    if core.fenced:  # ended before its run began: nothing runs
        finish_run(host, core, RunEnd(cancelled=True, cycle=cycle))
        return
    span = enter_span(core.cycle_trace or core.info.trace)
    try:
        if not core.holds_slot:
            core.acquire_slot_blocking()
        core.touch()  # stuck detection counts from the start of the run
        if cycle:  # a Main's cycle: what it received is recorded first
            host.record_input(core, handle.message)
        end = _end_of(skill(handle), cycle)
    except BaseException as exc:  # noqa: BLE001 - every raise ends the run somehow
        end = _end_by(exc, cycle)
    finally:
        leave_span(span)  # the thread serves other sessions next
    finish_run(host, core, end)


async def run_async(
    host: SessionHost,
    core: SessionCore,
    skill: Callable[[Any], Coroutine[Any, Any, object]],
    handle: Any,
    cycle: int,
) -> None:
    """Run an async skill as a task and report its end (also when it is cancelled by force).

    Run as a task of its own: it notes that task on ``core`` (a forced end cancels it).
    """
    loop = asyncio.get_running_loop()
    core.task = asyncio.current_task(loop)
    core.task_loop = loop
    end: RunEnd
    if core.fenced:
        finish_run(host, core, RunEnd(cancelled=True, cycle=cycle))
        return
    enter_span(core.cycle_trace or core.info.trace)  # this task's own context
    try:
        if not core.holds_slot:
            await core.acquire_slot_async()
        core.touch()
        if cycle:
            await host.arecord_input(core, handle.message)
        end = _end_of(await skill(handle), cycle)
    except BaseException as exc:  # noqa: BLE001 - every raise ends the run somehow
        end = _end_by(exc, cycle)
    finish_run(host, core, end)
