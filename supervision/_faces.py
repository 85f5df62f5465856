"""The two faces of one operation: an awaitable written once, a blocking one derived.

The node's operations are written once, as ``async def a<name>`` coroutine
methods (its async core: they await the Cortex's answer on the node's event
loop). ``blocking`` makes the other face, the plain method an application
thread calls: it runs the coroutine on the node's loop and waits for it.
``offloaded`` goes the other way for the few operations that are blocking
by nature (a shutdown, a wait for durable writes): the awaitable face runs
the blocking one on a worker thread, so the loop goes on meanwhile.

Each face keeps its operation's signature (mypy checks callers of both) and
docstring (``help()`` shows it). A blocking face refuses to run where it
could never end, as a blocking ask always has (``refuse_blocking``:
``DeadlockError`` on the node's loop or inside an actor handler), and
raises ``NodeClosedError`` once the node's loop has stopped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import types
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from sessiontree.actors.runtime import refuse_blocking
from sessiontree.protocol import NodeClosedError

__all__ = ["Faced", "blocking", "offloaded", "wait_on_loop"]

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound="Faced")
H = TypeVar("H")

# Real seconds between looks at whether the loop still runs while a blocking
# face waits (a loop stopped by a shutdown never finishes what it was handed).
_LOOK = 0.5


class Faced(Protocol):
    """What has blocking faces: a ``Node``, one of its groups, a ``SessionRef``."""

    def _loop_of_faces(self) -> asyncio.AbstractEventLoop:
        """The loop the awaitable operations run on (``NodeClosedError`` if gone)."""
        ...


def wait_on_loop(loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on ``loop`` (another thread's) and return what it returns,
    raising what it raises. ``DeadlockError`` (nothing run) on a thread where a
    blocking ask is refused; ``NodeClosedError`` if the loop is closed or stops
    before ``work`` ends. Interrupted (a Ctrl-C), the wait cancels ``work``, so
    its own clean-up runs."""
    try:
        refuse_blocking()
        future = asyncio.run_coroutine_threadsafe(work, loop)
    except RuntimeError as exc:  # the loop is closed: the node has shut down
        work.close()
        msg = "node is closed"
        raise NodeClosedError(msg) from exc
    except BaseException:
        work.close()
        raise
    try:
        while True:
            try:
                return future.result(_LOOK)
            except TimeoutError:
                if future.done():  # what ``work`` raised, not the wait's end
                    raise
                if not loop.is_running():
                    future.cancel()
                    with contextlib.suppress(RuntimeError):  # never started: nothing runs it
                        work.close()
                    msg = "node is closed"
                    raise NodeClosedError(msg) from None
    except concurrent.futures.CancelledError as exc:  # the loop's shutdown cancelled it
        msg = "node is closed"
        raise NodeClosedError(msg) from exc
    except BaseException:
        future.cancel()
        raise


class blocking(Generic[S, P, T]):  # noqa: N801 - used as a decorator, named like a function
    """The blocking face of an awaitable operation: ``get = blocking(aget)``
    in a class body makes ``get(...)``, which runs ``aget(...)`` on the
    owner's loop (``Faced``) and waits for it (see ``wait_on_loop``). The face
    has the operation's signature and docstring, and the name it is
    assigned to."""

    def __init__(self, operation: Callable[Concatenate[S, P], Coroutine[Any, Any, T]]) -> None:
        self.operation = operation

        @functools.wraps(operation)
        def face(owner: Any, /, *args: Any, **kwargs: Any) -> Any:
            return wait_on_loop(owner._loop_of_faces(), operation(owner, *args, **kwargs))

        self._face: Callable[..., T] = face

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._face.__name__ = name
        self._face.__qualname__ = f"{owner.__qualname__}.{name}"

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Callable[Concatenate[S, P], T]: ...

    @overload
    def __get__(self, obj: S, owner: type[Any]) -> Callable[P, T]: ...

    def __get__(self, obj: S | None, owner: type[Any]) -> Callable[..., T]:
        if obj is None:
            return self._face
        return types.MethodType(self._face, obj)


class offloaded(Generic[H, P, T]):  # noqa: N801 - used as a decorator, named like a function
    """The awaitable face of an operation that blocks by nature:
    ``ashutdown = offloaded(shutdown)`` makes ``await ashutdown(...)``, which
    runs ``shutdown(...)`` on a worker thread (``asyncio.to_thread``) while
    the loop goes on. Same signature and docstring, under the assigned name."""

    def __init__(self, operation: Callable[Concatenate[H, P], T]) -> None:
        self.operation = operation

        @functools.wraps(operation)
        async def face(owner: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(operation, owner, *args, **kwargs)

        self._face: Callable[..., Coroutine[Any, Any, T]] = face

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._face.__name__ = name
        self._face.__qualname__ = f"{owner.__qualname__}.{name}"

    @overload
    def __get__(
        self, obj: None, owner: type[Any]
    ) -> Callable[Concatenate[H, P], Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(self, obj: H, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: H | None, owner: type[Any]) -> Callable[..., Coroutine[Any, Any, T]]:
        if obj is None:
            return self._face
        return types.MethodType(self._face, obj)
