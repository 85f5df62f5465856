"""The ``ray`` backend: steps in pooled Ray actors on a Ray cluster.

Ray is imported only when the backend starts; without it the backend is
``BackendUnavailableError`` naming the ``sessiontree[ray]`` extra. With an
``address`` the node joins that cluster (``ray.init(address=...)``); without
one it starts a local cluster, unless the application already initialised
Ray (then that connection is used and left open at close).

Each pooled actor runs one step at a time; it is a threaded actor of
concurrency 4, so ``cancel`` reaches a step that is busy computing, also
while the node fetches the step's model calls. Killing a step is ``ray.kill``
of its actor, and the pool starts a replacement. Events a step reports travel
back with its end, except its model calls, which the step waits on: the node
fetches those while it runs (``StepActor.calls``, a long poll, one at a time
per step; a Ray driver cannot be called back) and sends each answer back
(``StepActor.answer``). A cluster that disappears (a step's
actor is unreachable, or two health pings go unanswered) fails the steps that
were on it with ``backend_unavailable``, refuses new ones, and the node lets
go of it (``ray.shutdown``) so Ray does not end the process; the node serves
the rest. Ray must be initialised on the main thread: the node does it when it
starts with this backend.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from sessiontree.actors.backends._pool import PooledRun, unavailable_end
from sessiontree.actors.backends._protocol import CALL_EVENTS, StepEnd, StepEvent, StepJob
from sessiontree.actors.backends._worker import StepControl, execute_step, worker_facts
from sessiontree.protocol import BackendUnavailableError, ErrorCode, ErrorInfo

__all__ = ["RayBackend", "StepActor", "import_ray"]

log = logging.getLogger("sessiontree.backend.ray")

_EXTRA = "pip install 'sessiontree[ray]'"

#: How long one fetch of a step's model calls waits for one (real seconds); the
#: node fetches again while the step runs.
FETCH_SECONDS = 10.0


def import_ray() -> Any:
    """``ray``, or ``BackendUnavailableError`` naming the extra that installs it."""
    try:
        import ray  # noqa: PLC0415 - Ray is optional and heavy: imported on first use
    except ImportError as exc:
        msg = f"the ray backend needs Ray, which is not installed ({exc}): {_EXTRA}"
        raise BackendUnavailableError(msg) from None
    return ray


class StepActor:
    """What one pooled Ray actor runs: one step at a time, its cancel, and the
    model calls it waits on (fetched by the node, answered back)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a call was sent, or a step ended
        self._current: StepControl | None = None
        # A threaded actor does not keep call order: a cancel may arrive first.
        self._early: dict[int, ErrorCode] = {}
        self._latest = 0  # the job that started here last (job ids only grow)
        self._calls: list[StepEvent] = []  # its call events the node has not fetched

    def ready(self) -> int:
        """Answered once the actor is up: its process id."""
        return os.getpid()

    def run(self, job: StepJob) -> StepEnd:
        """Run ``job`` here; its events come back with its end (its model calls
        are fetched with ``calls`` while it runs)."""
        events: list[StepEvent] = []

        def emit(event: StepEvent) -> None:
            if event[0] not in CALL_EVENTS:
                events.append(event)
                return
            with self._changed:
                self._calls.append(event)
                self._changed.notify_all()

        with self._lock:
            early = self._early.pop(job.job_id, None)
            self._early.clear()  # cancels of steps that already ended
            control = StepControl(job.job_id, job.cancel or early)
            self._current = control
            self._latest = job.job_id
            self._calls = []
        try:
            end = execute_step(job, control, emit, worker_facts("ray"))
        finally:
            with self._changed:
                self._current = None  # the next session finds nothing of this one
                self._changed.notify_all()
        return StepEnd(
            outcome=end.outcome,
            error=end.error,
            cancelled=end.cancelled,
            events=tuple(events),
            worker=end.worker,
        )

    def cancel(self, job_id: int, code: str) -> None:
        """Ask the step ``job_id`` (if it is the one running) to stop."""
        with self._lock:
            control = self._current
            if control is None or control.job_id != job_id:
                self._early[job_id] = ErrorCode(code)
                return
        control.cancel(ErrorCode(code))

    def calls(self, job_id: int, wait: float = FETCH_SECONDS) -> tuple[StepEvent, ...] | None:
        """The model-call events step ``job_id`` sent since the last fetch, as
        soon as there is one (none after ``wait`` seconds); None once that step
        is over here. A fetch that arrives before its step waits for it."""

        def over() -> bool:
            current = self._current
            return job_id <= self._latest and (current is None or current.job_id != job_id)

        def ready() -> bool:
            return bool(job_id == self._latest and self._calls) or over()

        with self._changed:
            self._changed.wait_for(ready, wait)
            if job_id == self._latest and self._calls:
                taken, self._calls = tuple(self._calls), []
                return taken
            return None if over() else ()

    def answer(self, job_id: int, call_id: int, data: bytes) -> None:
        """The node's answer to model call ``call_id`` of step ``job_id``
        (dropped unless that step is the one running)."""
        with self._lock:
            control = self._current
        if control is not None and control.job_id == job_id:
            control.answer(call_id, data)


class _RayRun(PooledRun):
    actor: Any = None
    killed = False


class RayBackend:
    """A pool of ``actors`` Ray actors (see the module docstring).

    ``num_cpus`` is what each actor reserves on the cluster; ``init_options``
    go to ``ray.init`` when this backend starts Ray itself; every
    ``health_interval`` real seconds one actor is pinged.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        actors: int = 2,
        num_cpus: float = 1.0,
        init_options: dict[str, Any] | None = None,
        health_interval: float = 2.0,
    ) -> None:
        self.address = address
        self.size = actors
        self.num_cpus = num_cpus
        self.init_options = dict(init_options or {})
        self._ray: Any = None
        self._actor_class: Any = None
        self._lock = threading.Lock()
        self._idle: collections.deque[Any] = collections.deque()
        self._actors: list[Any] = []  # every live actor: idle, busy or still starting
        # remote calls made under the lock, watched once it is released: a step
        # (answered by _done) and the first fetch of its model calls (_fetched)
        self._sent: collections.deque[tuple[_RayRun, Any, Callable[..., None]]] = (
            collections.deque()
        )
        self._answered: list[Any] = []  # actors that came up (the health watch pings one)
        self._queued: collections.deque[_RayRun] = collections.deque()
        self._running: dict[int, _RayRun] = {}
        self._broken: BackendUnavailableError | None = None
        self._booting: threading.Thread | None = None
        self._owns_ray = False
        self._closed = False
        self.started = 0
        """Actors started so far (replacements included)."""
        self.killed = 0
        """Actors killed to stop a step."""
        self._up = threading.Event()  # the first pool is up, or the backend failed
        self._booted = threading.Event()  # connected to a cluster
        self._stopping = threading.Event()  # closed or failed: the health watch ends
        self.disconnected = threading.Event()
        """Set once a lost cluster was let go of (``ray.shutdown``)."""
        self.health_interval = health_interval

    @property
    def unavailable(self) -> str | None:
        return None if self._broken is None else str(self._broken)

    # -- the pool's life -------------------------------------------------------------------

    def start(self) -> None:
        """Connect to Ray (``ray.init`` here, unless the application did) and start
        the actors in the background. Raises ``BackendUnavailableError`` when Ray
        is missing, cannot start, or must be started off the main thread (Ray
        only works when it was initialised on the main thread)."""
        with self._lock:
            if self._ray is not None:
                return
            ray = import_ray()
            if not ray.is_initialized():
                if threading.current_thread() is not threading.main_thread():
                    msg = (
                        "Ray is not initialised and can only be started on the main thread: "
                        "start the node with backend='ray' from the main thread, or call "
                        "ray.init() before the node"
                    )
                    raise BackendUnavailableError(msg)
                options: dict[str, Any] = {
                    "include_dashboard": False,
                    "log_to_driver": False,
                    "configure_logging": False,
                }
                options.update(self.init_options)
                try:
                    ray.init(address=self.address, **options)
                except Exception as exc:  # noqa: BLE001 - any failure to start makes it unavailable
                    msg = f"Ray could not start ({type(exc).__name__}: {exc})"
                    raise BackendUnavailableError(msg) from None
                self._owns_ray = True
            self._ray = ray
            self._booted.set()
            self._booting = threading.Thread(
                target=self._boot, name="sessiontree-ray-boot", daemon=True
            )
            self._booting.start()

    def _boot(self) -> None:
        ray = self._ray
        try:
            self._actor_class = ray.remote(num_cpus=self.num_cpus, max_concurrency=4)(StepActor)
            for _ in range(self.size):
                self._add_actor()
            threading.Thread(
                target=self._watch_health, name="sessiontree-ray-health", daemon=True
            ).start()
        except Exception as exc:  # noqa: BLE001 - any failure to boot makes it unavailable
            self._fail(f"the Ray actors could not start ({type(exc).__name__}: {exc})")

    def wait_ready(self, timeout: float) -> bool:
        """Block until the whole first pool is up (True), or it failed or
        ``timeout`` real seconds passed (False). For benchmarks and tests."""
        return self._up.wait(timeout) and self._broken is None

    def _add_actor(self) -> None:
        # Made and listed under the lock: every actor made before close() is in
        # the list it kills (creating one is a submission, it does not block).
        with self._lock:
            if self._closed or self._broken is not None:
                return
            actor = self._actor_class.remote()
            self.started += 1
            self._actors.append(actor)
        ref = actor.ready.remote()
        ref.future().add_done_callback(lambda f: self._actor_up(actor, f))

    def _actor_up(self, actor: Any, fut: concurrent.futures.Future[Any]) -> None:
        # On Ray's callback thread: a blocking Ray call here (ray.kill) waits on
        # that very thread, and close()'s own ray.kill then waits forever.
        try:
            fut.result()
        except Exception as exc:  # noqa: BLE001 - an actor that cannot start
            if not self._closed and actor in self._actors:  # not one close() killed
                self._fail(f"a Ray actor could not start ({type(exc).__name__}: {exc})")
            return
        with self._lock:
            if self._closed:
                return  # close() kills it, or has
            if self._broken is not None:  # _fail dropped it: it went with our cluster,
                # or the application's cluster lives on and it goes, off this thread
                if not self._owns_ray:
                    threading.Thread(
                        target=self._kill_quietly,
                        args=(actor,),
                        name="sessiontree-ray-kill",
                        daemon=True,
                    ).start()
                return
            if actor not in self._actors:
                return  # killed with its step, or died, already
            self._idle.append(actor)
            self._answered.append(actor)
            if len(self._answered) >= self.size:
                self._up.set()
            self._dispatch_locked()
        self._watch_sent()

    def _kill_quietly(self, actor: Any) -> None:
        with contextlib.suppress(Exception):  # its cluster may be gone as well
            self._ray.kill(actor, no_restart=True)

    def _fail(self, why: str) -> None:
        """The cluster is gone (or never came up): fail every step on it, refuse
        more, and disconnect — a Ray driver that stays connected to a dead
        cluster is ended by Ray itself after a minute, and this node must live on."""
        error = BackendUnavailableError(why)
        with self._lock:
            first = self._broken is None
            if first:
                self._broken = error
                log.error("ray backend unavailable: %s", why)
            runs = [*self._queued, *self._running.values()]
            self._queued.clear()
            self._running.clear()
            self._actors.clear()
            self._idle.clear()
        self._up.set()
        self._stopping.set()
        for run in runs:
            run.resolve(unavailable_end(run.job, why))
        if first and self._owns_ray and self._booted.is_set():
            threading.Thread(
                target=self._disconnect, name="sessiontree-ray-disconnect", daemon=True
            ).start()

    def _disconnect(self) -> None:
        with contextlib.suppress(Exception):
            self._ray.shutdown()
        self.disconnected.set()

    def _watch_health(self) -> None:
        """Ping one actor every ``health_interval`` real seconds; two pings in a
        row without an answer (three when only busy actors could be asked: a
        step may hold its process for a while) mean the cluster is gone. A dead
        GCS never fails the steps in flight on its own."""
        ray = self._ray
        misses = 0
        while not self._stopping.wait(self.health_interval):
            with self._lock:
                idle = next((a for a in self._idle if a in self._answered), None)
                actor = idle or next((a for a in self._actors if a in self._answered), None)
            if actor is None:
                continue
            try:
                ray.get(actor.ready.remote(), timeout=self.health_interval)
                misses = 0
            except ray.exceptions.ActorDiedError:
                misses = 0  # that actor was killed or died; the cluster answered
            except Exception as exc:  # noqa: BLE001 - no answer at all
                misses += 1
                if misses >= (2 if idle is not None else 3):
                    self._fail(f"the Ray cluster stopped answering ({type(exc).__name__})")

    def close(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self._booting is not None:
            self._booting.join(timeout)  # so every actor it starts is in the list below
        with self._lock:
            if self._closed:
                return
            self._closed = True
            runs = [*self._queued, *self._running.values()]
            self._queued.clear()
            self._running.clear()
            actors, self._actors = self._actors, []
            self._idle.clear()
        for run in runs:
            run.resolve(unavailable_end(run.job, "the ray backend closed"))
        ray = self._ray
        if ray is None:
            return
        for actor in actors:  # one whose kill fails (a cluster already gone) stops no other
            self._kill_quietly(actor)
        if self._owns_ray and self._broken is None:
            with contextlib.suppress(Exception):
                ray.shutdown()

    # -- steps ----------------------------------------------------------------------------

    def serialise(self, skill: Callable[..., Any]) -> bytes:
        """Ray's cloudpickle: closures and lambdas travel too. ``TypeError`` naming
        what could not be serialised (a lock, a socket…)."""
        ray = self._ray or import_ray()
        try:
            data: bytes = ray.cloudpickle.dumps(skill)
        except Exception as exc:  # noqa: BLE001 - cloudpickle raises many kinds
            name = getattr(skill, "__qualname__", None) or repr(skill)
            msg = f"{name!r} cannot be serialised: {exc}"
            raise TypeError(msg) from None
        return data

    def submit(
        self, job: StepJob, loop: asyncio.AbstractEventLoop, on_event: Callable[[StepEvent], None]
    ) -> _RayRun:
        run = _RayRun(self, job, loop, on_event)
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._closed:
                msg = "the ray backend is closed"
                raise BackendUnavailableError(msg)
            self._queued.append(run)
            self._dispatch_locked()
        self._watch_sent()
        return run

    def _dispatch_locked(self) -> None:
        while self._queued and self._idle:
            actor = self._idle.popleft()
            run = self._queued.popleft()
            job = run.job_to_send()
            run.actor = actor
            self._running[job.job_id] = run
            self._sent.append((run, actor.run.remote(job), self._done))
            self._sent.append((run, actor.calls.remote(job.job_id), self._fetched))

    def _watch_sent(self) -> None:
        """Watch the steps just sent (outside ``_lock``: a callback on a future
        that is already done runs at once, and takes the lock)."""
        while self._sent:
            run, ref, then = self._sent.popleft()
            ref.future().add_done_callback(lambda f, run=run, then=then: then(run, f))

    def _fetched(self, run: _RayRun, fut: concurrent.futures.Future[Any]) -> None:
        """The step's model calls came: hand them to the node, and fetch again
        while the step runs."""
        try:
            events = fut.result()
        except Exception:  # noqa: BLE001 - its actor is gone: the step's end tells
            return
        if events is None:
            return  # the step is over
        for event in events:
            with contextlib.suppress(RuntimeError):  # the loop closed with the node
                run.loop.call_soon_threadsafe(run.on_event, event)
        with self._lock:
            if run.killed or self._closed or self._running.get(run.job.job_id) is not run:
                return
            try:
                ref = run.actor.calls.remote(run.job.job_id)
            except Exception:  # noqa: BLE001 - the cluster is going: the step's end tells
                return
        ref.future().add_done_callback(lambda f: self._fetched(run, f))

    def _answer(self, run: _RayRun, call_id: int, data: bytes) -> None:
        with self._lock:
            actor = run.actor
            if actor is None or run.killed or self._running.get(run.job.job_id) is not run:
                return  # the step has ended: nobody waits for it
        with contextlib.suppress(Exception):  # its actor or cluster is gone; the end tells
            actor.answer.remote(run.job.job_id, call_id, data)

    def _done(self, run: _RayRun, fut: concurrent.futures.Future[Any]) -> None:
        ray = self._ray
        try:
            end = fut.result()
        except ray.exceptions.RayActorError as exc:
            with self._lock:
                self._running.pop(run.job.job_id, None)
                if run.actor in self._actors:
                    self._actors.remove(run.actor)
                if run.killed or self._closed:
                    return
            # Its actor died, or its whole cluster did: a ping (off Ray's callback
            # thread, bounded) tells which.
            threading.Thread(
                target=self._judge_death,
                args=(run, exc),
                name="sessiontree-ray-judge",
                daemon=True,
            ).start()
            return
        except Exception as exc:  # noqa: BLE001 - the cluster or its connection failed
            with self._lock:
                self._running.pop(run.job.job_id, None)
                if self._closed:
                    return
            why = f"the Ray cluster failed ({type(exc).__name__}: {exc})"
            self._fail(why)
            run.resolve(unavailable_end(run.job, why))
            return
        with self._lock:
            self._running.pop(run.job.job_id, None)
            # a step that ended as its actor was being killed leaves no actor to reuse
            if not self._closed and not run.killed and run.actor in self._actors:
                self._idle.append(run.actor)
                self._dispatch_locked()
        self._watch_sent()
        run.resolve(end)

    def _judge_death(self, run: _RayRun, exc: BaseException) -> None:
        if self._cluster_answers():
            with contextlib.suppress(Exception):
                self._add_actor()
            run.resolve(_actor_died(run.job, exc))
        else:
            self._fail(f"the Ray cluster is gone ({type(exc).__name__})")
            run.resolve(unavailable_end(run.job, "the Ray cluster is gone"))

    def _cluster_answers(self) -> bool:
        """Whether another actor of the pool answers a ping within ``health_interval``."""
        with self._lock:
            others = [a for a in self._actors if a in self._answered]
        for actor in others[:1]:
            try:
                self._ray.get(actor.ready.remote(), timeout=self.health_interval)
            except Exception:  # noqa: BLE001 - no answer at all
                return False
        return True

    def _cancel(self, run: _RayRun, code: ErrorCode) -> None:
        with self._lock:
            if run.cancel_code is None:
                run.cancel_code = code
            actor = run.actor
        if actor is not None:
            with contextlib.suppress(Exception):
                actor.cancel.remote(run.job.job_id, code.value)

    def _kill(self, run: _RayRun) -> None:
        with self._lock:
            if run in self._queued:
                self._queued.remove(run)
                return
            actor = run.actor
            if actor is None or run.killed or self._running.get(run.job.job_id) is not run:
                return
            run.killed = True
            self.killed += 1
            if actor in self._actors:
                self._actors.remove(actor)
        self._kill_quietly(actor)
        if not self._closed and self._broken is None:
            with contextlib.suppress(Exception):
                self._add_actor()


def _actor_died(job: StepJob, exc: BaseException) -> StepEnd:
    return StepEnd(
        error=ErrorInfo(
            code=ErrorCode.CRASHED,
            message=f"the Ray actor of session {job.info.session_id} died",
            detail={
                "backend": "ray",
                "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                "traceback": str(exc),
            },
        ),
        worker={"backend": "ray"},
    )
