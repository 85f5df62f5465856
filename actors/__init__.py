"""Sessions as actors: what a skill and an embedding application use.

A skill receives a :class:`Session` (sync) or an :class:`AsyncSession`
(``async def``); at every checkpoint a pending cancellation raises
:class:`Cancelled` into it. A session's working context is a
:class:`SessionContext` of :class:`ContextMessage` values, and its
conversation (``session.conversation``) is a :class:`ConversationLike`. Time
is a :class:`Clock`: :class:`RealClock` in production, :class:`VirtualClock`
in tests. A call to the Cortex that gets no answer in time raises
:class:`AskTimeoutError`.

Where a skill runs (``inline``, ``process``, ``ray``) is
``sessiontree.actors.backends``. The runtime's plumbing, which
``sessiontree.supervision`` assembles a node from, is
``sessiontree.actors.runtime``: not for applications.
"""

from sessiontree.actors._async_session import AsyncSession
from sessiontree.actors._clock import Clock, RealClock, TimerHandle, VirtualClock
from sessiontree.actors._compaction import Compaction
from sessiontree.actors._context import ContextMessage, SessionContext
from sessiontree.actors._conversing import ConversationLike
from sessiontree.actors._core import Cancelled
from sessiontree.actors._mailbox import AskTimeoutError
from sessiontree.actors._session import Session

__all__ = [
    "AskTimeoutError",
    "AsyncSession",
    "Cancelled",
    "Clock",
    "Compaction",
    "ContextMessage",
    "ConversationLike",
    "RealClock",
    "Session",
    "SessionContext",
    "TimerHandle",
    "VirtualClock",
]
