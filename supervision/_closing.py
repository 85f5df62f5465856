"""A node's shutdown, the Cortex's part: settle the tree, let the skills go, stop.

``NodeCore.shutdown`` decides whether to shut down and what to release
after; ``settle`` is what it asks the Cortex in between, in order: begin
(Mains kept, Branches suspended, Workers cancelled within the grace), say
what it waits for, wait (a Ctrl-C forces it), force what did not settle,
let the skills held at a checkpoint go, stop every actor. A shutdown's
timeout bounds real time whatever clock the node runs on.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from sessiontree.actors import AskTimeoutError, RealClock
from sessiontree.actors.runtime import Reply
from sessiontree.protocol import SessionInfo
from sessiontree.supervision._exits import CtrlC, say
from sessiontree.supervision._requests import (
    BeginShutdown,
    ForceWorkers,
    ListSessions,
    ReleaseParked,
    Request,
    ShutdownDeadline,
    ShutdownPending,
    StopAll,
)

__all__ = ["settle"]

log = logging.getLogger("sessiontree.node")

_CTRL_C_POLL = 0.1  # real seconds between looks at a Ctrl-C while a shutdown waits
_AFTER_CTRL_C = 1.0  # real seconds a forced shutdown still waits for what it let go
_REAL = RealClock()


class Closing(Protocol):
    """What a shutdown uses of its node."""

    _forced: bool  # force_shutdown asked for it
    _ctrl_c_seen: int  # the Ctrl-Cs already acted on
    final_sessions: list[SessionInfo]

    def _send(self, request: Request[Any], reply: Reply) -> None: ...

    def _call(
        self, request: Request[Any], *, timeout: float | None = None, check: bool = True
    ) -> Any: ...

    def _force_now(self) -> None: ...


def settle(node: Closing, grace: float, timeout: float, why: str | None, ctrl_c: CtrlC) -> None:
    """Settle ``node``'s tree (within ``grace``, ``timeout`` real seconds at
    most, less after a Ctrl-C), let the skills still running go, stop every
    actor. ``why``: "interrupt", "exit" or None (what the announcement says)."""
    reply = Reply()
    node._send(BeginShutdown(grace), reply)
    if node._forced:  # force_shutdown came first
        node._force_now()
    elif not reply.done:
        _announce(node, grace, why, ctrl_c)
    if not _wait(node, reply, timeout, ctrl_c):
        log.warning("shutdown did not settle in %.1f s; forcing", timeout)
        node._call(ShutdownDeadline(), check=False)
        node._call(ForceWorkers(), check=False)
    node.final_sessions = node._call(ListSessions(), check=False)
    # Let the running skills go (``Cancelled`` with ``node_closed`` at their
    # checkpoint) and wait for those held at a checkpoint to end, so no
    # thread is left blocked behind a closed node.
    released = Reply()
    node._send(ReleaseParked(), released)
    if not _wait(node, released, timeout, ctrl_c):
        log.warning("a skill let go at shutdown did not return in time")
    node._call(StopAll(), check=False)


def _announce(node: Closing, grace: float, why: str | None, ctrl_c: CtrlC) -> None:
    """Say what the shutdown waits for and how long (nothing if for nothing)."""
    pending = node._call(ShutdownPending(), check=False)
    if not pending:
        return
    sessions = "1 session" if pending == 1 else f"{pending} sessions"
    when = " at exit (shutdown() was not called)" if why == "exit" else ""
    line = f"shutting down{when}: waiting up to {grace:g} s for {sessions} to wrap up"
    if ctrl_c.installed:
        line += "; Ctrl-C again to stop now" if why == "interrupt" else "; Ctrl-C to stop now"
    say(logging.WARNING if why else logging.INFO, line)


def _wait(node: Closing, reply: Reply, timeout: float, ctrl_c: CtrlC) -> bool:
    """Wait up to ``timeout`` real seconds for ``reply`` (raising what it
    failed with); False if it did not come. A Ctrl-C meanwhile (``ctrl_c``
    installed: it is looked at every ``_CTRL_C_POLL`` s) forces the
    shutdown, and the wait goes on for ``_AFTER_CTRL_C`` s at most."""
    if node._ctrl_c_seen:  # forced by a Ctrl-C already: what is left is quick
        timeout = min(timeout, _AFTER_CTRL_C)
    deadline = _REAL.monotonic() + timeout
    while True:
        left = deadline - _REAL.monotonic()
        if left <= 0:
            return reply.done
        try:
            reply.get(min(left, _CTRL_C_POLL) if ctrl_c.installed else left)
        except AskTimeoutError:
            pass
        else:
            return True
        if ctrl_c.count > node._ctrl_c_seen:
            node._ctrl_c_seen = ctrl_c.count
            if not node._forced:
                say(logging.WARNING, "stopping now: what still runs ends by force")
                node._forced = True
                node._force_now()
            deadline = min(deadline, _REAL.monotonic() + _AFTER_CTRL_C)
