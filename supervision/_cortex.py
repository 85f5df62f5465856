"""The Cortex: the one actor that decides every change of the session tree.

Every spawn, state change and result goes through its mailbox, so the tree
index (ids, parent, children, kind, state, deadlines) is consistent by
construction. Session actors get their orders from the Cortex only; skill
threads report to it. Handlers never block: they tell, never ask.

This module is the actor: it takes the Node's typed requests (``_requests``)
and the runtime's reports (``_reports``) and hands each to the part that owns
it: the tree's state (``_tree``), spawning, starting runs, endings,
cancellation, suspension, messages, the periodic check, queries, shutdown.

A handler that raises means the index can no longer be trusted: the node
fails loudly (every waiting caller gets ``NodeClosedError`` naming the cause)
instead of running headless.
"""

from __future__ import annotations

import logging
from types import CoroutineType
from typing import Any

from sessiontree.actors.runtime import Counted, Reply, drain_inbox, handler_scope, post
from sessiontree.protocol import (
    CancelCmd,
    ErrorCode,
    ErrorInfo,
    NodeClosedError,
    RejectedInputError,
    ResumeCmd,
    SendCmd,
    SpawnCmd,
    SuspendCmd,
    UnknownSessionError,
)
from sessiontree.supervision import _queries as queries
from sessiontree.supervision._cancelling import Cancelling
from sessiontree.supervision._commits import Commits
from sessiontree.supervision._endings import Endings
from sessiontree.supervision._events import Event, EventKind
from sessiontree.supervision._messages import Messages
from sessiontree.supervision._periodic import Periodic
from sessiontree.supervision._reports import (
    ChildUpdate,
    CycleStarted,
    Deadline,
    Expire,
    Granted,
    Idle,
    Parked,
    Progress,
    Reap,
    Refused,
    RunEnded,
    RunsEnded,
    Streamed,
    Tick,
)
from sessiontree.supervision._requests import (
    DEFERRED,
    AwaitResult,
    BeginShutdown,
    BringBack,
    Call,
    Cancel,
    Control,
    ForceWorkers,
    ForgetWaiter,
    GetActorRef,
    GetInfo,
    GetResult,
    GetResults,
    GetSpending,
    GetStats,
    GetTree,
    Interrupt,
    ListSessions,
    ListStuck,
    OpenMain,
    ProbeParked,
    Redeliver,
    ReleaseParked,
    ReleaseReplay,
    Request,
    Resume,
    Run,
    Send,
    ShutdownDeadline,
    ShutdownPending,
    Spawn,
    SpawnMany,
    StopAll,
    Suspend,
)
from sessiontree.supervision._runtime import Runtime
from sessiontree.supervision._shutdown import Shutdown
from sessiontree.supervision._spawning import Spawning
from sessiontree.supervision._starting import Starting
from sessiontree.supervision._suspension import Suspension
from sessiontree.supervision._tree import Tree

__all__ = ["Cortex"]

log = logging.getLogger("sessiontree.cortex")

#: What an operation raises for a bad request (before it changes anything);
#: anything else raised in a handler is a broken invariant and fails the node.
_CALLER_MISTAKES = (UnknownSessionError, RejectedInputError, NodeClosedError)
_STOP_BATCH = 4096  # ended actors waiting to stop: past this they stop at once
_STOP_WHEN_QUIET = 256  # ...and past this whenever the inbox is empty


class Cortex:
    """The Cortex's message handling; made a ``LoopActor`` by ``actor_class``,
    served on the node's event loop. Every method runs there, one message at a
    time ("the Cortex thread" in the docstrings of the rooms)."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.rt = runtime
        self.commits = Commits(runtime)
        self.commits.raised = self._raised  # a raise in the rest of an operation
        self.tree = tree = Tree(runtime)
        self.starting = Starting(tree)
        self.endings = Endings(tree, self.commits)
        self.cancelling = Cancelling(tree, self.commits, self.endings)
        self.endings.on_orphans = self.cancelling.orphans
        self.spawning = Spawning(tree, self.commits, self.starting, self.cancelling)
        self.suspension = Suspension(tree, self.starting)
        self.messages = Messages(tree, self.commits)
        self.periodic = Periodic(tree, self.suspension, self.endings.store_held)
        self.shutdown = Shutdown(tree, self.cancelling, self.suspension, self.periodic)
        self.failed: BaseException | None = None
        self.stopped = False
        for extension in runtime.extensions.all:  # they keep the parts they act on
            extension.bind(self)

    # -- pykka hooks --------------------------------------------------------

    def on_start(self) -> None:
        """Runs on the Cortex thread before any message; arms the periodic check."""
        self.tree.ref = self.actor_ref  # type: ignore[attr-defined]
        self.rt.activity.on_idle = self.on_idle
        self.periodic.arm()
        self.rt.started.set()

    def on_stop(self) -> None:
        """Runs on the Cortex thread as it stops: ended actors are stopped, and
        callers still queued or waiting get ``NodeClosedError`` instead of
        waiting for their timeout."""
        self.stopped = True
        self.commits.stop()
        self.rt.activity.on_idle = None
        self.tree.stop_ended()
        self._fail_waiters(NodeClosedError("the node stopped before the session ended"))
        drain_inbox(self, self.rt.activity, self._refuse_stopped)  # type: ignore[arg-type]

    def on_failure(self, *exc_info: Any) -> None:
        """Runs on the Cortex thread if it dies: the node fails loudly."""
        error = exc_info[1] if len(exc_info) > 1 else None
        self.rt.on_failed(error or NodeClosedError("the cortex died"))

    def on_receive(self, message: Any) -> Any:
        """Handle one message. Unknown messages are counted and refused; a raise
        inside a handler fails the node loudly (see the module docstring)."""
        counted = isinstance(message, Counted)
        body = message.message if counted else message
        try:
            with handler_scope():
                return self._dispatch(body)
        except BaseException as exc:  # noqa: BLE001 - the node fails loudly (see _raised)
            self._raised(exc, body.reply if isinstance(body, Call) else None, body)
            return None
        finally:
            to_stop = len(self.tree.to_stop)
            if to_stop >= _STOP_BATCH or (to_stop >= _STOP_WHEN_QUIET and self._inbox_empty()):
                self.tree.stop_ended()
            if counted:
                self.rt.activity.end()

    def _raised(self, exc: BaseException, reply: Reply | None, body: object = None) -> None:
        """A handler, or the rest of an operation (``Commits.after``), raised
        ``exc``: a ``KeyboardInterrupt``/``SystemExit`` shuts the node down in
        order, anything else fails it loudly; ``reply``'s caller hears why."""
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            self.rt.on_fatal(exc)
            if reply is not None:
                reply.fail(NodeClosedError(f"{exc!r} inside the runtime; shutting down"))
            return
        log.critical("cortex handler for %r raised; the node fails", body, exc_info=exc)
        if reply is not None:
            reply.fail(NodeClosedError(f"cortex failed: {exc!r}"))
        self._fail(exc)

    def on_idle(self) -> None:
        """``Activity.on_idle``: ask for a ``Reap`` if ended actors wait to stop.

        Runs on whichever thread finished the last piece of work; it only posts.
        """
        ref = self.tree.ref
        if self.tree.to_stop and ref is not None and not self.stopped and ref.is_alive():
            post(ref, Reap(), self.rt.activity)

    # -- dispatch -----------------------------------------------------------------

    def _dispatch(self, body: Any) -> Any:
        if self.failed is not None and not isinstance(body, Call):
            return None  # the index is untrusted: nothing more is decided from it
        match body:
            case Call(request=request, reply=reply):
                self._call(request, reply)
            case RunEnded():
                self.endings.runs_ended((body,))
            case RunsEnded(ends=ends):
                self.endings.runs_ended(ends)
            case Granted(session_id=sid):
                self.starting.granted(sid)
            case Parked(session_id=sid):
                self.suspension.parked(sid)
            case Idle(session_id=sid, mark=mark):
                self.periodic.idle(sid, mark)
            case Expire(session_ids=ids):
                for sid in ids:
                    self.cancelling.expire(sid)
            case Deadline(session_ids=ids):
                self.cancelling.deadline(ids)
            case Progress(session_id=sid, note=note, data=data):
                self.messages.progress(sid, note, data)
            case Streamed(pieces=pieces):
                for sid, text in pieces:
                    self.messages.progress(sid, "", {"delta": text})
            case ChildUpdate(session_id=sid, message=message):
                self.messages.child_update(sid, message)
            case CycleStarted():
                self.messages.cycle_started(body)
            case Refused(session_id=sid, what=what):
                self.rt.counters["refused_after_fence"] += 1
                self.tree.emit(EventKind.REFUSED, self.tree.entries.get(sid), data={"what": what})
            case Tick(memory=used):
                self.tree.stop_ended()
                self.periodic.tick(used)
            case Reap():
                self.tree.stop_ended()
            case _:  # a control command too: those come as a Control request
                self._reject(body)
                return ErrorInfo(
                    code=ErrorCode.REJECTED_INPUT,
                    message=f"the cortex does not take {type(body).__name__}",
                )
        return None

    def _call(self, request: Request[Any], reply: Reply | None) -> None:
        """Answer one request on ``reply``. A caller's mistake fails the reply
        (or, with nobody waiting, is counted) and changes nothing."""
        if self.failed is not None and not isinstance(request, StopAll):
            if reply is not None:
                reply.fail(NodeClosedError(f"node failed: {self.failed!r}"))
            return
        try:
            value = self._answer(request, reply)
        except _CALLER_MISTAKES as exc:  # answered; the index is untouched
            if reply is None:  # nobody waits for the answer: count it, never fail
                self.rt.counters["rejected_messages"] += 1
                log.warning("cortex refused %r: %s", request, exc)
                return
            reply.fail(exc)
            return
        if type(value) is CoroutineType:  # the rest of the operation answers, once it returns
            self.commits.after(value, reply)
        elif reply is not None and value is not DEFERRED:
            reply.set(value)

    def _answer(self, request: Request[Any], reply: Reply | None) -> object:
        """The answer to ``request``; or the rest of the operation, a coroutine
        whose value answers ``reply`` once the store wrote what it waits for
        (``Commits.after``); or ``DEFERRED`` when the part that handles it
        answers ``reply`` itself (once a session ends)."""
        tree = self.tree
        match request:
            case Spawn(parent_id=parent_id, spec=spec, by_skill=by_skill):
                return self.spawning.spawn(parent_id, spec, by_skill=by_skill)
            case Run(parent_id=parent_id, spec=spec, timeout=timeout):
                assert reply is not None  # a run is its caller's waiter
                return self.spawning.run(parent_id, spec, reply, timeout)
            case SpawnMany(parent_id=parent_id, specs=specs, by_skill=by_skill):
                return self.spawning.spawn_many(parent_id, specs, by_skill=by_skill)
            case Send(
                session_id=sid,
                message=message,
                unwedge=unwedge,
                trace=trace,
                message_id=mid,
                request_id=request_id,
            ):
                return self.messages.send(
                    sid,
                    message,
                    unwedge=unwedge,
                    trace=trace,
                    message_id=mid,
                    request_id=request_id,
                )
            case Redeliver(session_id=sid, result=result, unwedge=unwedge):
                return self.messages.redeliver(sid, result, unwedge)
            case ReleaseReplay():
                return self.starting.release_replay() + self.endings.store_held.release()
            case Cancel(session_id=sid, grace=grace, reason=reason):
                return self.cancelling.cancel(sid, grace, reason)
            case Interrupt(session_id=sid, code=code):
                self.cancelling.interrupt(sid, code)
                return None
            case Suspend(session_id=sid):
                return self.suspension.suspend(sid)
            case Resume(session_id=sid):
                return self.suspension.resume(sid)
            case Control(command=command):
                return self._control(command, reply)
            case OpenMain(agent_id=agent_id, key=key):
                return self.spawning.open_main(agent_id, key)
            case BringBack():
                plan, self.rt.recovered = self.rt.recovered, None
                if plan is not None:
                    self.suspension.adopt(self.starting.bring_back(plan))
                return None
            case GetInfo(session_id=sid):
                return queries.info(tree, sid)
            case AwaitResult(session_id=sid):
                assert reply is not None  # a waiter is its reply
                return queries.await_result(tree, sid, reply)
            case ForgetWaiter(session_id=sid, reply=waiter):
                queries.forget_waiter(tree, sid, waiter)
                return None
            case GetResult(session_id=sid):
                return queries.result(tree, sid)
            case GetResults(session_id=sid):
                return queries.received(tree, sid)
            case GetSpending(session_id=sid):
                return queries.spending(tree, sid)
            case GetTree(session_id=sid):
                return queries.subtree(tree, sid)
            case ListSessions(state=state, kind=kind):
                return queries.sessions(tree, state, kind)
            case ListStuck():
                return queries.stuck(tree)
            case GetStats():
                return queries.stats(tree) | {
                    "pressure_suspended": self.suspension.pressure_suspended(),
                    "store_held_mains": len(self.endings.store_held),
                }
            case GetActorRef(session_id=sid):
                return queries.actor_ref(tree, sid)
            case ProbeParked(session_id=sid, probe=probe):
                return queries.probe_parked(tree, sid, probe)
            case BeginShutdown(grace=grace):
                assert reply is not None  # answered once the tree settled
                return self.shutdown.begin(grace, reply)
            case ShutdownDeadline():
                self.shutdown.deadline()
                return None
            case ShutdownPending():
                return tree.shutdown_pending()
            case ForceWorkers():
                self.shutdown.force_workers()
                return None
            case ReleaseParked():
                assert reply is not None  # answered once the released runs ended
                return self.shutdown.release_parked(reply)
            case StopAll():
                return self.shutdown.stop_all()
        extension = self.rt.extensions.answering.get(type(request))
        if extension is not None:  # a feature's own request (a model call's reservation)
            return extension.answer(request, reply)
        msg = f"the cortex has no operation {type(request).__name__}"
        raise RejectedInputError(msg)

    def _control(self, command: object, reply: Reply | None) -> object:
        """Apply one decoded control command (see ``protocol.ControlMessage``) as
        the request it stands for; ``RejectedInputError`` for anything else."""
        match command:
            case SpawnCmd(parent_id=parent_id, spec=spec):
                request: Request[Any] = Spawn(parent_id, spec)
            case SendCmd(session_id=sid, message=message):
                request = Send(sid, message)
            case CancelCmd(session_id=sid):
                request = Cancel(sid)
            case SuspendCmd(session_id=sid):
                request = Suspend(sid)
            case ResumeCmd(session_id=sid):
                request = Resume(sid)
            case _:
                msg = f"not a control command: {type(command).__name__}"
                raise RejectedInputError(msg)
        return self._answer(request, reply)

    # -- refusals and failure ------------------------------------------------------

    def _reject(self, body: object) -> None:
        self.rt.counters["rejected_messages"] += 1
        log.warning("cortex refused a message of type %s", type(body).__name__)

    def _inbox_empty(self) -> bool:
        inbox = getattr(self, "actor_inbox", None)
        return inbox is None or inbox.empty()

    def _refuse_stopped(self, body: object) -> None:
        if isinstance(body, Call) and body.reply is not None:
            body.reply.fail(NodeClosedError("the node stopped before answering"))

    def _fail_waiters(self, error: NodeClosedError) -> None:
        for entry in self.tree.entries.values():
            for reply in entry.waiters:
                reply.fail(error)
            entry.waiters.clear()

    def _fail(self, error: BaseException) -> None:
        if self.failed is not None:
            return
        self.failed = error
        self.commits.stop()
        tree = self.tree
        tree.closing = True
        self._fail_waiters(NodeClosedError(f"node failed: {error!r}"))
        for reply in tree.shutdown_waiters:
            reply.fail(NodeClosedError(f"node failed: {error!r}"))
        tree.shutdown_waiters.clear()
        self.rt.events.emit(
            Event(kind=EventKind.NODE_FAILED, at=tree.now(), data={"error": repr(error)})
        )
        self.rt.on_failed(error)
