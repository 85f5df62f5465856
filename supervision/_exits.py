"""How an embedded node ends with the program around it: Ctrl-C while it
shuts down, and an interpreter that exits without calling ``shutdown()``.

**Ctrl-C.** A node installs no signal handler while it runs: the first
Ctrl-C is the application's (Python's ``KeyboardInterrupt``, by default),
and a ``with Node(...)`` block it leaves shuts the node down. Only for the
length of a shutdown, and only when the shutdown runs on the main thread
while SIGINT still has Python's default handler, does ``CtrlC`` take SIGINT
over: a Ctrl-C then cuts the grace short (what still runs is ended by force)
instead of raising ``KeyboardInterrupt`` inside the wait. The previous
handler is put back when the shutdown ends. An application that installed
a SIGINT handler of its own (or ignores SIGINT), an asyncio program
(``asyncio.run`` installs one), or a shutdown on another thread keeps its
signals: it calls ``node.force_shutdown()`` itself for the same effect.

``Interrupted`` is the ``KeyboardInterrupt`` a ``with Node(...)`` block
re-raises once the node is down: still a ``KeyboardInterrupt`` to every
``except KeyboardInterrupt``, and a ``SystemExit(130)`` to the interpreter,
so a script nobody catches it in exits with status 130 (the shell's
128 + SIGINT) and no traceback.

**Exit.** A node that is still open when the interpreter exits is shut down
then (``shut_down_at_exit``), as ``shutdown()`` would: its store records a
clean stop, so the next start does not count the run as a crash toward
``restart_intensity``. Only a process that dies without running its exit
hooks (SIGKILL, a fatal signal, ``os._exit``) leaves a run counted as crashed.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Self

__all__ = [
    "INTERRUPTED_STATUS",
    "CtrlC",
    "Interrupted",
    "forget_at_exit",
    "say",
    "shut_down_at_exit",
]

log = logging.getLogger("sessiontree.node")

INTERRUPTED_STATUS = 130
"""A program ended by Ctrl-C exits with 128 + SIGINT, as shells report it."""


class Interrupted(SystemExit, KeyboardInterrupt):
    """A Ctrl-C that has shut the node down, on its way out of the program."""

    def __init__(self) -> None:
        super().__init__(INTERRUPTED_STATUS)


def say(level: int, line: str) -> None:
    """Tell the person running the program ``line``: on the ``sessiontree.node``
    logger when the application has set logging up (a handler on the way up
    that is not a ``NullHandler``), else, at WARNING and above, on stderr,
    prefixed ``sessiontree:`` (as Python's last-resort handler would, which
    the package's ``NullHandler`` otherwise keeps quiet)."""
    current: logging.Logger | None = log
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            log.log(level, "%s", line)
            return
        current = current.parent if current.propagate else None
    if level >= logging.WARNING:
        sys.stderr.write(f"sessiontree: {line}\n")
        sys.stderr.flush()


class CtrlC:
    """SIGINT, taken over for the length of a shutdown where that is safe.

    ``installed`` says whether it was: only on the main thread, and only
    when SIGINT has Python's default handler (``signal.default_int_handler``).
    While installed, a Ctrl-C only counts (``count``); the shutdown looks at
    the count between short waits, so nothing runs inside the signal handler
    that could wait on a lock the interrupted code holds.
    """

    def __init__(self) -> None:
        self.count = 0
        self.installed = False
        self._previous: Callable[[int, FrameType | None], object] | int | None = None

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1

    def __enter__(self) -> Self:
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                return self  # the application's own handler, or SIGINT ignored: theirs
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main interpreter
            return self
        self.installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.installed:
            return
        self.installed = False
        # Put the previous handler back unless someone replaced ours meanwhile.
        if signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, self._previous)


# -- the interpreter's exit ---------------------------------------------------------

_open: dict[int, tuple[int, Callable[[], None]]] = {}  # id(node) -> (pid, its exit shutdown)
_open_lock = threading.Lock()
_hooked = False


def shut_down_at_exit(key: int, shutdown: Callable[[], None]) -> None:
    """Call ``shutdown`` when the interpreter exits, unless ``forget_at_exit(key)``
    came first. It runs before the interpreter waits for the program's own
    (non-daemon) threads, which may be waiting on the node, and before
    ``concurrent.futures`` stops taking work (``asyncio.to_thread``), which
    a skill wrapping up may use; where that hook is missing, at ``atexit``."""
    global _hooked  # noqa: PLW0603 - one hook per process, made on first use
    with _open_lock:
        _open[key] = (os.getpid(), shutdown)
        if _hooked:
            return
        _hooked = True
    register = getattr(threading, "_register_atexit", None)  # what concurrent.futures uses
    try:
        if register is None:
            raise RuntimeError
        register(_at_exit)
    except RuntimeError:  # no such hook, or the threads' exit is under way already
        atexit.register(_at_exit)


def forget_at_exit(key: int) -> None:
    """The node with ``key`` has shut down: nothing to do for it at exit."""
    with _open_lock:
        _open.pop(key, None)


def _at_exit() -> None:
    """Shut down every node still open, in turn; never raises (a node that
    fails to shut down is logged), and a forked child leaves its parent's
    nodes alone."""
    pid = os.getpid()
    with _open_lock:
        pending = [shutdown for owner, shutdown in _open.values() if owner == pid]
        _open.clear()
    for shutdown in pending:
        try:
            shutdown()
        except Exception:  # the next node still gets its shutdown
            log.exception("a node could not shut down at exit")
