"""The live state of one session, shared by its actor and its running skill."""

from __future__ import annotations

import _thread
import asyncio
import collections
import contextlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sessiontree.actors._activity import Activity
from sessiontree.actors._clock import Clock
from sessiontree.actors._context import SessionContext
from sessiontree.actors._slots import ComputeSlots
from sessiontree.protocol import ErrorCode, SessionInfo, SessionResult

if TYPE_CHECKING:
    from sessiontree.actors._tape import Tape
    from sessiontree.actors.backends._protocol import ExecutionBackend

__all__ = [
    "AsyncWaiter",
    "Cancelled",
    "CycleInput",
    "SessionCond",
    "SessionCore",
    "wake_batch",
]

AsyncWaiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class Cancelled(BaseException):
    """Raised into a skill at a checkpoint once its session is asked to stop.

    It subclasses ``BaseException`` so that ``except Exception`` in skill code
    cannot swallow it. ``code`` says why: ``cancelled`` (an explicit cancel),
    ``parent_terminated`` (the parent ended), or — once the skill is fenced and
    nothing it does counts — ``terminated_by_force``, ``ttl_expired`` or
    ``node_closed`` (a branch that never parked during a shutdown).
    """

    # No __init__ of its own: ``Cancelled(code, session_id)`` is built by
    # BaseException alone (a cascade raises one per session), and the two fields
    # are read from ``args``. The message is made when shown, for the same reason.
    if TYPE_CHECKING:

        def __init__(self, code: ErrorCode, session_id: uuid.UUID) -> None: ...

    @property
    def code(self) -> ErrorCode:
        """Why the session was cancelled."""
        code: ErrorCode = self.args[0]
        return code

    @property
    def session_id(self) -> uuid.UUID:
        """The session it was raised into."""
        session_id: uuid.UUID = self.args[1]
        return session_id

    def __str__(self) -> str:
        return f"session {self.session_id} cancelled ({self.code})"


@dataclass(slots=True)
class CycleInput:
    """What a Main's running message cycle runs for.

    ``seq``: the message's number in the Main's stored inbox (None for a
    child's result, or on a node without a store). ``key``: the identity of
    the message or result (``m`` and the message's id, ``r`` and the child's
    id; None when it has none), the same when a rerun runs it again: the
    cycle's conversation appends are keyed by it and by their order
    (``effects`` counts them), so a rerun replaces what an earlier run wrote
    instead of adding to it. ``context``: the working context as the cycle
    found it (on a node with a store), put back when the store refuses the
    cycle so that its retry starts where it did. ``recorded``: the user's
    turn was written with the cycle's start (else the run records it).
    ``fresh``: no run of this input can have written anything before (a
    message accepted by this process, running for the first time), so its
    appends need not look for what they would replace.
    """

    seq: int | None = None
    key: str | None = None
    effects: int = 0
    context: SessionContext | None = None
    recorded: bool = False
    fresh: bool = False

    def next_effect(self) -> tuple[str, int, bool] | None:
        """The key of the cycle's next conversation append: its input's key, its
        place among the cycle's appends, and whether an earlier run may have
        written it (None when the input has no key)."""
        if self.key is None:
            return None
        place = self.effects
        self.effects += 1
        return self.key, place, not self.fresh


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


# typeshed marks RLock final; the C type is subclassable (3.11 to 3.13 checked).
class SessionCond(_thread.RLock):  # type: ignore[misc]
    """``threading.Condition()`` (over an ``RLock``), as the session's shared
    state needs it: ``with``, ``acquire``/``release``, ``wait()`` without a
    timeout, ``notify_all()``. A Condition keeps five bound methods of its
    lock and a deque of waiters per instance; a node holds one per session,
    and the garbage collector walks them all. This is the ``RLock`` itself
    (so ``with`` takes it without a Python call: every checkpoint, wait and
    ending passes here), the list of waiters made only when a thread waits
    (async skills never do).

    ``wait`` raises ``RuntimeError`` unless the calling thread holds the lock;
    ``notify_all`` must be called holding it (not checked: it is on every wake).
    """

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[Any] | None = None

    def wait(self) -> None:
        """Release the lock fully, block until ``notify_all``, take it back."""
        lock: Any = self  # the private methods threading.Condition uses too
        if not lock._is_owned():
            msg = "cannot wait on an un-acquired lock"
            raise RuntimeError(msg)
        waiter = _thread.allocate_lock()
        waiter.acquire()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        saved = lock._release_save()
        try:
            waiter.acquire()
        finally:
            lock._acquire_restore(saved)

    def notify_all(self) -> None:
        """Wake every thread in ``wait`` (call holding the lock)."""
        waiters = self._waiters
        if waiters:
            self._waiters = None
            for waiter in waiters:
                waiter.release()


class SessionCore:
    """Everything about one live session that its actor and its skill share.

    The Cortex thread decides ``state``, files child results and sets the
    cancel, suspend and fence requests; the session actor starts runs; the
    skill thread reads the requests at checkpoints. All of it is guarded by
    ``cond``. Blocking waits release the compute slot and count the skill as
    blocked for :class:`Activity`. ``resumed`` is set when a session comes
    back from the store after a restart; ``cycle_input`` is what a Main's
    current cycle runs for (``input_seq`` its stored inbox number), ``attempt`` which run
    of its work this is (more than 1 once crashes cut runs of it off). ``remote`` is set for a
    session whose skill runs on another backend (a process, a Ray actor).
    ``cycle_trace``: a traced Main's running cycle's span.
    """

    # Set on an instance only on a traced node: a class default keeps the
    # instance's attributes under what CPython's key-sharing dicts hold (at 30
    # every session's dict became one of its own, 296 -> 1,584 bytes, and
    # spawns ran 7 % slower; tests/test_traces.py guards the count).
    cycle_trace: str | None = None
    # Set only on a session of a recorded or replayed run (see ``_tape``).
    tape: Tape | None = None
    # Set only on a Main's cycle with a store: waits until its start is on record
    # (``Session.attempt`` calls it)
    mark_durable: Callable[[], None] | None = None

    def __init__(
        self,
        info: SessionInfo,
        *,
        clock: Clock,
        activity: Activity,
        slots: ComputeSlots,
        max_results: int,
    ) -> None:
        self.info = info
        self.session_id = info.session_id
        self.state = info.state
        self.clock = clock
        self.activity = activity
        self.slots = slots
        self.cond = SessionCond()
        self.context = SessionContext()
        self.received: collections.deque[SessionResult] = collections.deque(maxlen=max_results)
        self.unclaimed: dict[uuid.UUID, SessionResult] = {}
        self.updates: collections.deque[tuple[uuid.UUID, Any]] = collections.deque(
            maxlen=max_results
        )
        self.cancel_code: ErrorCode | None = None
        self.cancel_raised = False
        self.suspend_requested = False
        self.parked = False
        self.fence_code: ErrorCode | None = None
        self.release_code: ErrorCode | None = None  # a closing node let the skill go
        self.resumed = False
        self.cycle_input: CycleInput | None = None
        self.attempt = 1
        self.last_checkpoint = clock.monotonic()
        self.stuck = False
        self.holds_slot = False
        self.skill_running = False
        self._blocked = False
        self._async_waiters: list[AsyncWaiter] = []
        self.task: asyncio.Task[Any] | None = None
        self.task_loop: asyncio.AbstractEventLoop | None = None
        self.remote: tuple[ExecutionBackend, bytes] | None = None
        """Where the skill runs when not inline: the backend and the skill's bytes."""

    @property
    def input_seq(self) -> int | None:
        """The stored inbox number of the message a Main's current cycle runs
        (None for a child's result, or without a store)."""
        cycle_input = self.cycle_input
        return None if cycle_input is None else cycle_input.seq

    def next_effect(self) -> tuple[str, int, bool] | None:
        """The key of the running cycle's next conversation append (see
        ``CycleInput``); None outside a Main's cycle, or for an input without one."""
        with self.cond:
            cycle_input = self.cycle_input
            return None if cycle_input is None else cycle_input.next_effect()

    # -- compute slot ---------------------------------------------------------

    def take_slot(self) -> None:
        """Record that this session holds a slot (it was granted elsewhere)."""
        with self.cond:
            self.holds_slot = True

    def release_slot(self) -> None:
        """Give the slot back if this session holds one (idempotent)."""
        with self.cond:
            if not self.holds_slot:
                return
            self.holds_slot = False
        self.slots.release()

    def run_over(self) -> None:
        """A run ended: give its slot back (if held) and note that no skill runs."""
        with self.cond:
            held, self.holds_slot = self.holds_slot, False
            self.skill_running = False
        if held:
            self.slots.release()

    def acquire_slot_blocking(self) -> None:
        """Wait (this thread) for a compute slot."""
        self.slots.acquire_blocking()
        self.take_slot()

    async def acquire_slot_async(self) -> None:
        """Wait (this task) for a compute slot without holding a thread."""
        if self.slots.try_acquire():
            self.take_slot()
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def granted() -> None:
            call_soon(loop, _set_done, fut)

        if not self.slots.acquire_or_queue(granted):
            try:
                await fut
            except asyncio.CancelledError:
                if not self.slots.forget(granted):
                    self.slots.release()
                raise
        self.take_slot()

    # -- requests the Cortex sets ----------------------------------------------

    @property
    def fenced(self) -> bool:
        """True once the session ended under a running skill: nothing it does counts."""
        return self.fence_code is not None

    def fence(self, code: ErrorCode) -> None:
        """Fence the session (``terminated_by_force``, ``ttl_expired``…) and wake the skill."""
        with self.cond:
            if self.fence_code is None:
                self.fence_code = code
            self.wake()

    def release(self, code: ErrorCode) -> None:
        """A closing node lets the skill go (``node_closed``): at the checkpoint it
        waits at, or its next one, the session is fenced with ``code`` and the
        skill gets ``Cancelled``, so its thread or task ends. A run that ends
        before reaching one ends as it would have."""
        with self.cond:
            if self.release_code is None:
                self.release_code = code
            self.wake()

    def cancel_task(self) -> None:
        """Cancel an async skill's task (forced termination); nothing for a sync one."""
        task, loop = self.task, self.task_loop
        if task is not None and loop is not None:
            call_soon(loop, task.cancel)

    @property
    def letting_go(self) -> bool:
        """True once fenced or released: the skill takes no compute slot again."""
        return self.fence_code is not None or self.release_code is not None

    def _interrupted(self, *, parking: bool, landing: bool = False) -> bool:
        if self.letting_go:
            return True
        if landing:
            return False
        if self.cancel_code is not None and not self.cancel_raised:
            return True
        return not parking and self.suspend_requested and self.cancel_code is None

    def wake(self, batch: list[AsyncWaiter] | None = None) -> None:
        """Wake the skill if it is blocked (call with ``cond`` held).

        Async waiters are woken through their loop, or added to ``batch`` for
        :func:`wake_batch` (one loop wake-up for many sessions).
        """
        if self._blocked:
            self._blocked = False
            self.activity.begin()
        self.cond.notify_all()  # nothing to do when no thread waits (async skills)
        if not self._async_waiters:
            return
        waiters, self._async_waiters = self._async_waiters, []
        if batch is not None:
            batch.extend(waiters)
            return
        for loop, fut in waiters:
            call_soon(loop, _set_done, fut)

    def add_async_waiter(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None]) -> None:
        """Have the next ``wake()`` set ``fut`` (call with ``cond`` held); the
        session is not counted as blocked for it."""
        self._async_waiters.append((loop, fut))

    def request_suspend(self, wanted: bool) -> None:
        """Ask the skill to park at its next checkpoint (True) or let it go (False)."""
        with self.cond:
            self.suspend_requested = wanted
            self.wake()

    def request_cancel(self, code: ErrorCode, batch: list[AsyncWaiter] | None = None) -> None:
        """Mark cancellation as requested (the first reason stays) and wake the
        skill; a replay's tape may keep it back until its recorded place."""
        tape = self.tape
        if tape is not None and tape.defer_cancel(code):
            return
        with self.cond:
            if self.cancel_code is None:
                self.cancel_code = code
            self.wake(batch)

    def add_result(self, result: SessionResult) -> None:
        """File a child's result and wake the skill if it waits for it (a
        replay's tape may keep it back, to file it in its recorded turn with
        ``file_results``)."""
        tape = self.tape
        if tape is not None and tape.holds(result):
            return
        self.file_results((result,))

    def file_results(self, results: Sequence[SessionResult]) -> None:
        """File children's results now, together, and wake the skill once."""
        with self.cond:
            for result in results:
                self.received.append(result)
                self.unclaimed[result.session_id] = result
            self.wake()

    def add_update(self, child_id: uuid.UUID, message: Any) -> None:
        """File a child's ``send_to_parent`` message and wake the skill."""
        with self.cond:
            self.updates.append((child_id, message))
            self.wake()

    def claim(self, child_id: uuid.UUID) -> SessionResult | None:
        """Take a child's result out of the unclaimed set (call with ``cond`` held)."""
        return self.unclaimed.pop(child_id, None)

    # -- blocking waits (skill side) -------------------------------------------

    def _mark_blocked(self) -> None:
        if not self._blocked:
            self._blocked = True
            self.activity.end()

    def _unmark_blocked(self) -> None:
        if self._blocked:
            self._blocked = False
            self.activity.begin()

    def _timeout(
        self, timeout: float | None, loop: asyncio.AbstractEventLoop | None = None
    ) -> tuple[_Timeout, _Cancellable | None]:
        """A flag set (and the skill woken) when ``timeout`` passes on the clock.

        For an async wait (``loop``) on a clock that can time it on that loop
        (``RealClock.call_later_on``) the timer never crosses threads.
        """
        on_timeout = _Timeout(self)
        if timeout is None:
            return on_timeout, None
        on_loop = None if loop is None else getattr(self.clock, "call_later_on", None)
        if on_loop is not None:
            timer: _Cancellable = on_loop(loop, timeout, on_timeout)
        else:
            timer = self.clock.call_later(timeout, on_timeout)
        return on_timeout, timer

    def block_until(
        self,
        ready: Callable[[], bool],
        timeout: float | None,
        *,
        parking: bool = False,
        landing: bool = False,
    ) -> None:
        """Block the skill thread until ``ready()``, an interrupt (cancel, fence, or a
        suspension unless ``parking``; only a fence when ``landing``: a model
        call in flight when its budget ran out finishes) or ``timeout`` on the
        session's clock.
        Releases the compute slot while blocked and takes one again before
        returning (unless fenced); the caller checks what happened.
        """
        timed_out, timer = self._timeout(timeout)
        released = False
        try:
            with self.cond:
                while not (
                    ready()
                    or self._interrupted(parking=parking, landing=landing)
                    or timed_out.fired
                ):
                    if self.holds_slot:
                        self.holds_slot = False
                        released = True
                        self.cond.release()
                        try:
                            self.slots.release()
                        finally:
                            self.cond.acquire()
                        continue
                    self._mark_blocked()
                    self.cond.wait()
                self._unmark_blocked()
        finally:
            if timer is not None:
                timer.cancel()
            if released and not self.letting_go:
                self.acquire_slot_blocking()

    async def block_until_async(
        self,
        ready: Callable[[], bool],
        timeout: float | None,
        *,
        parking: bool = False,
        landing: bool = False,
    ) -> None:
        """``block_until`` for async skills: parks the task, never a thread."""
        loop = asyncio.get_running_loop()
        timed_out, timer = self._timeout(timeout, loop)
        released = False
        unmarked = False
        try:
            while True:
                fut: asyncio.Future[None] | None = None
                with self.cond:
                    interrupted = self._interrupted(parking=parking, landing=landing)
                    if ready() or interrupted or timed_out.fired:
                        # done under this one acquisition: unblocked, and the
                        # slot back at once when one is free (the usual case)
                        self._unmark_blocked()
                        unmarked = True
                        if released and not self.letting_go and self.slots.try_acquire():
                            self.holds_slot = True
                            released = False
                        break
                    if self.holds_slot:
                        self.holds_slot = False
                        released = True
                    else:
                        fut = loop.create_future()
                        self._async_waiters.append((loop, fut))
                        self._mark_blocked()
                if fut is None:
                    self.slots.release()
                    continue
                await fut
        finally:
            if timer is not None:
                timer.cancel()
            if not unmarked:
                with self.cond:
                    self._unmark_blocked()
        if released and not self.letting_go:
            await self.acquire_slot_async()

    @property
    def blocked(self) -> bool:
        """True while the skill waits at a checkpoint (on children, a timeout or parked)."""
        return self._blocked

    def touch(self) -> None:
        """Note a checkpoint (for stuck detection)."""
        self.last_checkpoint = self.clock.monotonic()
        self.stuck = False


class _Timeout:
    """The timer callback of a wait: sets ``fired`` and wakes the skill. One
    object where a closure over a flag took five; every waiting session holds one."""

    __slots__ = ("core", "fired")

    def __init__(self, core: SessionCore) -> None:
        self.core = core
        self.fired = False

    def __call__(self) -> None:
        core = self.core
        with core.cond:
            self.fired = True
            core.wake()


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: Any) -> None:
    """``loop.call_soon_threadsafe`` that does nothing once the loop is closed.

    A node shutting down, or an application whose loop ended, must never make
    the thread that wakes a waiter (the Cortex, an actor) raise.
    """
    if asyncio._get_running_loop() is loop:  # on the loop's thread: no wake-up to pay
        loop.call_soon(fn, *args)
        return
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def _set_all(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:  # _set_done, inline: a cascade sets thousands in one call
        if not fut.done():
            fut.set_result(None)


def wake_batch(batch: list[AsyncWaiter]) -> None:
    """Wake the async waiters ``wake(batch)`` collected: one call per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for loop, fut in batch:
        by_loop.setdefault(loop, []).append(fut)
    for loop, futures in by_loop.items():
        call_soon(loop, _set_all, futures)
