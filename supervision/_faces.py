"""The two faces of one operation: an awaitable written once, a blocking one derived.

The node's operations are written once, as ``async def a<name>`` coroutine
methods (its async core), whose only waits are for the Cortex's answers:
each goes through ``answer``. ``blocking`` makes the other face, the plain
method another thread calls: it runs the coroutine to its end on the calling
thread, in one step, with ``answer`` waiting there for the ``Reply`` as a
blocking ask (``Reply.get``) instead of awaiting it. So a blocking call costs
what a blocking ask always has (no hop through the event loop, no task) and
keeps its guard: ``DeadlockError`` on the node's loop or inside an actor
handler (``refuse_blocking``), before anything is asked.

``offloaded`` goes the other way for the few operations that block by
nature (a shutdown, a wait for durable writes, a pattern's driver): the
awaitable face runs the blocking one on a worker thread, the loop going on.

Each face keeps its operation's signature (mypy checks callers of both),
docstring (``help()`` shows it) and the name it is assigned to.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import types
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from sessiontree.actors.runtime import Reply, refuse_blocking

__all__ = ["answer", "blocking", "offloaded", "run_blocking"]

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")

# ``on`` while ``run_blocking`` drives an operation on this thread. A thread's
# own, not a context variable: a context is carried along with what the
# operation posts to the Cortex, and so into the tasks the Cortex starts.
_DRIVING = threading.local()


async def answer(reply: Reply, timeout: float) -> Any:
    """The Cortex's answer on ``reply``, within ``timeout`` real seconds: awaited
    on an event loop, or waited for on the calling thread when a blocking face
    runs the operation. Raises as ``Reply.get`` does (``AskTimeoutError``,
    what the Cortex failed the request with)."""
    if getattr(_DRIVING, "on", False):
        return reply.get(timeout)
    return await reply.get_async(timeout)


def run_blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` (an operation whose waits all go through ``answer``) to its
    end on the calling thread and return what it returns, raising what it
    raises. ``DeadlockError`` before anything runs where a blocking ask is
    refused (the node's loop, an actor handler); ``RuntimeError`` if ``work``
    awaits anything besides ``answer`` (a bug: it would need a loop)."""
    try:
        refuse_blocking()
    except BaseException:
        work.close()
        raise
    outer = getattr(_DRIVING, "on", False)
    _DRIVING.on = True
    try:
        work.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        _DRIVING.on = outer
    work.close()
    msg = f"{getattr(work, '__qualname__', work)} awaited something besides the Cortex's answer"
    raise RuntimeError(msg)


class blocking(Generic[S, P, T]):  # noqa: N801 - used as a decorator, named like a function
    """The blocking face of an awaitable operation: ``get = blocking(aget)`` in
    a class body makes ``get(...)``, which runs ``aget(...)`` on the calling
    thread and waits there for the Cortex (``run_blocking``). The face has the
    operation's signature and docstring, and the name it is assigned to."""

    def __init__(self, operation: Callable[Concatenate[S, P], Coroutine[Any, Any, T]]) -> None:
        self.operation = operation

        @functools.wraps(operation)
        def face(owner: Any, /, *args: Any, **kwargs: Any) -> Any:
            return run_blocking(operation(owner, *args, **kwargs))

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


class offloaded(Generic[S, P, T]):  # noqa: N801 - used as a decorator, named like a function
    """The awaitable face of an operation that blocks by nature:
    ``ashutdown = offloaded(shutdown)`` makes ``await ashutdown(...)``, which
    runs ``shutdown(...)`` on a worker thread (``asyncio.to_thread``) while
    the loop goes on. Same signature and docstring, under the assigned name."""

    def __init__(self, operation: Callable[Concatenate[S, P], T]) -> None:
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
    ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(self, obj: S, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: S | None, owner: type[Any]) -> Callable[..., Coroutine[Any, Any, T]]:
        if obj is None:
            return self._face
        return types.MethodType(self._face, obj)
